"""Scenario ``real``: Gemma 3 270M on the native llama-server, asked directly and
through the router, at 1 and 4 concurrent streaming clients.

Each run starts the launcher afresh (``python -m slm_server backends``, the ``gemma``
entry of ``config/models.yaml.example`` on a free port) and, for ``slm_server``, the
router in front of it; the targets alternate, round after round. Every request has a
unique prompt and ``ignore_eos``, so every answer is exactly ``max_tokens`` tokens and
no prompt is served from llama.cpp's cache. Reported: aggregate tokens/s, TTFT and
time per token, and the ratios router ÷ direct within each round.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvloop

from benchmarks.loadgen import Workload, closed_loop
from benchmarks.meter import ProcessMeter
from benchmarks.overhead import Rounds
from benchmarks.report import DASH, DIVIDE, TIMES, show, table
from benchmarks.servers import Server, free_port, launcher, router_for
from tests.integration.real_stack import example_registry, llama_server_bin

ROLE = "gemma"
TARGETS = ("direct", "slm_server")
PROMPT = "Tell me a short story about a lighthouse keeper and a storm."


@dataclass(frozen=True)
class Plan:
    rounds: int = 3
    max_tokens: int = 64
    # Requests per level; the first ``warmup`` of them at concurrency 1 go unrecorded.
    requests: tuple[tuple[int, int], ...] = ((1, 6), (4, 12))
    warmup: int = 2


def gemma_models() -> dict[str, dict[str, Any]]:
    ports = {"standard": 0, "gemma": free_port(), "embeddings": 0}
    models: dict[str, dict[str, Any]] = example_registry(ports, roles=(ROLE,))["models"]
    return models


async def measure(server: Server, llama_pid: int, plan: Plan) -> list[dict[str, Any]]:
    base = Workload(
        url=server.url,
        model=server.model,
        stream=True,
        max_tokens=plan.max_tokens,
        prompt=PROMPT,
        extra_body={"ignore_eos": True, "temperature": 0.0},
        timeout=300.0,
    )
    await closed_loop(base, 1, requests=plan.warmup)
    levels = []
    for concurrency, count in plan.requests:
        pids = {"server": server.pid}
        if server.pid != llama_pid:
            pids["backend"] = llama_pid
        meter = ProcessMeter(pids)
        async with meter:
            run = await closed_loop(base, concurrency, requests=count)
        summary = run.summary()
        processes = meter.result()
        tokens = summary["tokens_per_s"] * summary["wall_s"]
        served = processes["server"]
        served["cpu_us_per_chunk"] = served["cpu_s"] / tokens * 1e6 if tokens else None
        summary["server"] = served
        summary["backend"] = processes.get("backend", served)
        levels.append({"cell": f"stream-c{concurrency}", "concurrency": concurrency} | summary)
    return levels


def run_target(
    name: str, round_index: int, plan: Plan, workdir: Path, say: Callable[[str], None]
) -> dict[str, Any]:
    models = gemma_models()
    model_id = models[ROLE]["id"]
    env = {"SLM_LLAMA_SERVER_BIN": llama_server_bin()}
    with launcher(workdir, models, env) as launched:
        llama_pid = int(launched.states()[ROLE]["pid"])
        direct = Server(
            "llama-server", llama_pid, f"http://127.0.0.1:{models[ROLE]['port']}", model_id
        )
        if name == "direct":
            cells = uvloop.run(measure(direct, llama_pid, plan))
        else:
            with router_for(workdir, launched.env) as router:
                target = Server(router.name, router.pid, router.url, model_id)
                cells = uvloop.run(measure(target, llama_pid, plan))
    for cell in cells:
        say(
            f"  round {round_index} {name:10} c={cell['concurrency']}: "
            f"{cell['tokens_per_s']:6.1f} tok/s, TTFT p50 {cell['ttft_ms']['p50'] or 0:7.1f} ms, "
            f"{cell['ok']}/{cell['requests']} ok"
        )
    return {"round": round_index, "target": name, "cells": cells}


def run_rounds(plan: Plan, workdir: Path, say: Callable[[str], None]) -> list[dict[str, Any]]:
    return [
        run_target(name, r, plan, workdir / f"r{r}-{name}", say)
        for r in range(1, plan.rounds + 1)
        for name in TARGETS
    ]


def headlines(rounds: Rounds, plan: Plan) -> list[tuple[str, dict[str, Any]]]:
    """The ratios router ÷ direct (the issue sets no target for them)."""
    found = []
    for concurrency, _count in plan.requests:
        cell = f"stream-c{concurrency}"
        tokens = rounds.ratio("slm_server", "direct", cell, "tokens_per_s")
        ttft = rounds.ratio("slm_server", "direct", cell, "ttft_ms.p50")
        found.append((f"tokens/s router {DIVIDE} direct, c={concurrency} ({TIMES})", tokens))
        found.append((f"TTFT p50 router {DIVIDE} direct, c={concurrency} ({TIMES})", ttft))
    return found


def failures(rounds: Rounds, target: str, cell: str) -> str:
    """Failed requests of all rounds, by kind: ``3/36 (http 502: 3)``."""
    sent = failed = 0
    kinds: dict[str, int] = {}
    for r in rounds.rounds:
        summary = rounds.cells.get((target, r, cell), {})
        sent += int(summary.get("requests", 0))
        failed += int(summary.get("requests", 0)) - int(summary.get("ok", 0))
        for kind, count in summary.get("errors", {}).items():
            kinds[kind] = kinds.get(kind, 0) + count
    detail = ", ".join(f"{kind}: {count}" for kind, count in sorted(kinds.items()))
    return f"{failed}/{sent}" + (f" ({detail})" if detail else "")


def tables(rounds: Rounds, plan: Plan) -> str:
    header = ["clients", "target", "tokens/s", "TTFT p50 (ms)", "TTFT p99 (ms)"]
    header += ["time per token p50 (ms)", "latency p50 (ms)", "router CPU per chunk (µs)"]
    header += ["failed (all rounds)"]
    rows = []
    for concurrency, _count in plan.requests:
        cell = f"stream-c{concurrency}"
        for target in TARGETS:
            cpu = DASH
            if target == "slm_server":
                cpu = show(rounds.stat(target, cell, "server.cpu_us_per_chunk"), 0)
            rows.append(
                [
                    str(concurrency),
                    "llama-server" if target == "direct" else "through slm_server",
                    show(rounds.stat(target, cell, "tokens_per_s"), 1),
                    show(rounds.stat(target, cell, "ttft_ms.p50"), 1),
                    show(rounds.stat(target, cell, "ttft_ms.p99"), 1),
                    show(rounds.stat(target, cell, "time_per_token_ms.p50"), 2),
                    show(rounds.stat(target, cell, "latency_ms.p50"), 0),
                    cpu,
                    failures(rounds, target, cell),
                ]
            )
    ratio_rows = []
    for concurrency, _count in plan.requests:
        cell = f"stream-c{concurrency}"
        ratio_rows.append(
            [
                str(concurrency),
                show(rounds.ratio("slm_server", "direct", cell, "tokens_per_s"), 3),
                show(rounds.ratio("slm_server", "direct", cell, "ttft_ms.p50"), 3),
            ]
        )
    ratios = table(["clients", "tokens/s ratio", "TTFT p50 ratio"], ratio_rows)
    return table(header, rows) + "\n\nRouter ÷ direct, within each round:\n\n" + ratios
