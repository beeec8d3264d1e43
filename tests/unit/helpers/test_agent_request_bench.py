"""The pure parts of the ``agent_request`` benchmark: its cells, the bodies it sends,
and the ratios it reports and checks."""

from __future__ import annotations

import json
from typing import Any

import pytest

from benchmarks import agent_request
from benchmarks.agent_request import PRESET_MODEL, QUICK, Bodies, Cell, Plan, Variant
from benchmarks.loadgen import SERIAL, answer_shape
from benchmarks.overhead import Rounds
from benchmarks.report import DASH, TIMES
from benchmarks.servers import BENCH_MODEL
from tests.agent_request import TOOL_NAMES, system_prompt


def test_each_preset_cell_is_measured_right_after_its_twin() -> None:
    cells = [cell.key for cell in Plan().cells()]
    assert len(cells) == len(set(cells)) == 3 * 2 * 2 + 3 * 2
    assert cells[:4] == [
        "chat-whole-c1",
        "chat+preset-whole-c1",
        "chat-stream-c1",
        "chat+preset-stream-c1",
    ]
    assert cells[-1] == "messages-stream-c8"
    # In even rounds the cell with the preset comes first.
    assert [cell.key for cell in Plan().cells(2)][:2] == ["chat+preset-whole-c1", "chat-whole-c1"]
    assert sorted(cell.key for cell in Plan().cells(2)) == sorted(cells)
    shown = [cell.key for cell in Plan().shown()]
    assert shown[:6] == [
        "chat-whole-c1",
        "chat-stream-c1",
        "responses-whole-c1",
        "responses-stream-c1",
        "messages-whole-c1",
        "messages-stream-c1",
    ]
    assert all("+preset" in key for key in shown[-6:])
    # The quick plan: one client, every shape with and without the preset, one round.
    assert [c.concurrency for c in QUICK.cells()] == [1] * 12 and QUICK.rounds == 1


@pytest.mark.parametrize("shape", ["chat", "responses", "messages"])
@pytest.mark.parametrize("preset", [False, True])
@pytest.mark.parametrize("stream", [False, True])
def test_bodies_are_the_agent_request_in_each_shape(shape: str, preset: bool, stream: bool) -> None:
    system = system_prompt(40)
    raw = Variant(shape, preset).body(system, 256, stream)
    assert raw.count(SERIAL) == 1  # each request's serial goes into the user's message
    body = json.loads(raw)
    assert body["model"] == (PRESET_MODEL if preset else BENCH_MODEL)
    assert body.get("stream", False) is stream
    assert len(body["tools"]) == len(TOOL_NAMES)
    assert json.dumps(system) in raw.decode()  # whole, as the shape carries it
    assert answer_shape(Variant(shape).endpoint).name == shape


def _cell(cell: str, cpu_us: float, p50: float, rps: float = 100.0) -> dict[str, Any]:
    return {
        "cell": cell,
        "ok": 100,
        "throughput_rps": rps,
        "client_cpu_share": 0.1,
        "latency_ms": {"p50": p50, "p90": p50 * 2},
        "ttft_ms": {"p50": p50 / 2},
        "server": {"cpu_us_per_request": cpu_us, "cpu_share": 0.5},
        "backend": {"cpu_s": 0.01, "cpu_share": 0.01},
    }


def _runs(plan: Plan, router_cpu: dict[str, float]) -> list[dict[str, Any]]:
    runs = []
    for r in (1, 2, 3):
        for target in ("direct", "slm_server"):
            cells = []
            for cell in plan.cells():
                if target == "direct":
                    cells.append(_cell(cell.key, 50.0, 0.1))
                else:
                    cpu = router_cpu[cell.variant.key] * (1 + (r - 2) / 100)
                    cells.append(_cell(cell.key, cpu, cpu / 1000 + 0.1))
            runs.append({"round": r, "target": target, "cells": cells})
    return runs


def test_checks_are_ratios_within_each_round() -> None:
    plan = Plan(concurrency=(1,))
    cpu = {"chat": 1000.0, "responses": 3200.0, "messages": 1800.0}
    cpu |= {"chat+preset": 1050.0, "responses+preset": 3840.0, "messages+preset": 1800.0}
    found = {c.name: c for c in agent_request.checks(Rounds(_runs(plan, cpu)), plan)}
    assert len(found) == 4 + 5  # no preset check of a whole chat answer (serialised anew)
    responses = found["router CPU per request, Responses ÷ chat completions, whole, c=1"]
    assert responses.stat["median"] == pytest.approx(3.2) and not responses.passed
    messages = found["router CPU per request, Messages ÷ chat completions, stream, c=1"]
    assert messages.stat["median"] == pytest.approx(1.8) and messages.passed
    preset = found["router CPU per request, preset ÷ none, chat completions, stream, c=1"]
    assert preset.stat["median"] == pytest.approx(1.05) and preset.passed
    assert not found["router CPU per request, preset ÷ none, Responses, stream, c=1"].passed


def test_tables_show_every_cell_the_added_latency_and_the_preset_cost() -> None:
    plan = QUICK
    cpu = {"chat": 1000.0, "responses": 2000.0, "messages": 1500.0}
    cpu |= {"chat+preset": 1100.0, "responses+preset": 2000.0, "messages+preset": 1500.0}
    rounds = Rounds(_runs(plan, cpu))
    keys = [f"{v}-{k}" for v in cpu for k in ("whole", "stream")]
    bodies = Bodies(
        {k: b"x" * 90_000 for k in keys},
        {k: b"y" * 91_000 for k in keys},
        {k: 400 for k in keys},
    )
    text = agent_request.tables(rounds, plan, bodies)
    # chat completions, whole, 1 client: direct 0.1 ms, router 1.1 ms (1 ms added, 11 x).
    direct, router, added = (
        _range(0.10, 0.10, 0.10),
        _range(1.10, 1.09, 1.11),
        _range(1, 0.99, 1.01),
    )
    assert f"| chat completions | whole | 1 | {direct} | {router} | {added} |" in text
    assert f"| {_range(11, 10.9, 11.1)} {TIMES} | {DASH} | {added} |" in text
    # The preset's cost: 1,100 µs against 1,000 in each round.
    plain = f"1,000 [990{DASH}1,010]"
    preset = f"1,100 [1,089{DASH}1,111]"
    assert f"| chat completions | whole | 1 | {plain} | {preset} | 100 " in text
    assert "| responses+preset-stream | 90,000 | 91,000 | 400 |" in text
    headlines = dict(agent_request.headlines(rounds, plan))
    assert len(headlines) == 6
    assert headlines[f"chat whole c=1: p50 router ÷ direct ({TIMES})"]["median"] == pytest.approx(
        11
    )


def _range(median: float, low: float, high: float) -> str:
    return f"{median:.2f} [{low:.2f}{DASH}{high:.2f}]"


def test_a_cell_key_names_the_shape_the_preset_the_answer_and_the_clients() -> None:
    assert Cell(Variant("messages", preset=True), True, 8).key == "messages+preset-stream-c8"
    assert Variant("responses", preset=True).label == "Responses, preset"
