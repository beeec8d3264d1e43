"""Scenario ``body_burst``: the router's memory under a burst of huge bodies (issue 33).

Eight clients at once send 30 MiB bodies (``tests/huge_bodies.py``: plain text, 50,000
messages, integers, small objects) on the chat, Messages and Responses routes, to a
router with the default limits in front of the fast fake (which does not parse large
bodies). Measured per burst: the router's resident memory before, its peak (sampled
every 10 ms) and 10 s after, and the answers. With ``--against REV`` the router of
that commit runs the same bursts in the same rounds: before and after.

Goal: the peak within the baseline plus twice ``SLM_MAX_BODIES_IN_FLIGHT_MB`` (256 MiB),
and back within 100 MB of the baseline 10 s after.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

from benchmarks.overhead import AGAINST
from benchmarks.report import Check, spread, table
from benchmarks.servers import BENCH_MODEL, fast_fake, slm_router
from tests.huge_bodies import MIB, ROUTES, SHAPES, sampled

CLIENTS = 8
BUDGET_MB = 256
SETTLE_SECONDS = 10.0


@dataclass(frozen=True)
class Plan:
    rounds: int = 1
    shapes: tuple[str, ...] = ("strings", "messages", "numbers", "objects")
    routes: tuple[str, ...] = ROUTES


def _for_model(body: bytes) -> bytes:
    return body.replace(b'"model":"big"', b'"model":"' + BENCH_MODEL.encode() + b'"', 1)


def _send(client: httpx.Client, url: str, body: bytes) -> str:
    try:
        reply = client.post(url, content=body, headers={"content-type": "application/json"})
    except httpx.HTTPError as exc:
        return type(exc).__name__
    return str(reply.status_code)


def burst(router_pid: int, url: str, route: str, body: bytes) -> dict[str, Any]:
    """One burst: the baseline, peak and settled memory (MiB), and the answers."""
    process = psutil.Process(router_pid)
    baseline = process.memory_info().rss
    with (
        httpx.Client(trust_env=False, timeout=120) as client,
        sampled(router_pid) as samples,
        ThreadPoolExecutor(CLIENTS) as pool,
    ):
        answers = list(pool.map(lambda _i: _send(client, url + route, body), range(CLIENTS)))
    peak = max(samples)
    time.sleep(SETTLE_SECONDS)  # the measurement is what is left after this long
    settled = process.memory_info().rss
    return {
        "baseline_mib": baseline / MIB,
        "peak_over_mib": (peak - baseline) / MIB,
        "settled_over_mib": (settled - baseline) / MIB,
        "answers": dict(Counter(answers)),
    }


def run_rounds(plan: Plan, workdir: Path, say: Callable[[str], None]) -> list[dict[str, Any]]:
    trees = {"this": None, **{f"@{short}": tree for short, tree in AGAINST.items()}}
    runs: list[dict[str, Any]] = []
    for number in range(1, plan.rounds + 1):
        for label, tree in trees.items():
            where = workdir / f"round{number}-{label.strip('@')}"
            where.mkdir(parents=True, exist_ok=True)
            with fast_fake(where, chunks=4) as fake:
                options: dict[str, Any] = {} if tree is None else {"tree": tree}
                with slm_router(where / "router", [fake], **options) as router:
                    for shape in plan.shapes:
                        for route in plan.routes:
                            body = _for_model(SHAPES[shape](route))
                            found = burst(router.pid, router.url, route, body)
                            found |= {"round": number, "target": label, "shape": shape}
                            found["route"] = route
                            runs.append(found)
                            say(
                                f"  {label} {shape} {route}: peak +{found['peak_over_mib']:.0f}"
                                f" MiB, after 10 s +{found['settled_over_mib']:.0f} MiB, "
                                f"{found['answers']}"
                            )
    return runs


def checks(runs: list[dict[str, Any]]) -> list[Check]:
    mine = [r for r in runs if r["target"] == "this"]
    return [
        Check(
            "peak over the baseline, worst burst (MiB)",
            2 * BUDGET_MB,
            "MiB",
            spread([max(r["peak_over_mib"] for r in mine)]),
        ),
        Check(
            "memory over the baseline 10 s after, worst burst (MiB)",
            100,
            "MiB",
            spread([max(r["settled_over_mib"] for r in mine)]),
        ),
    ]


def tables(runs: list[dict[str, Any]]) -> str:
    rows = []
    for r in runs:
        answers = ", ".join(f"{n} x {code}" for code, n in sorted(r["answers"].items()))
        rows.append(
            [
                r["target"],
                r["shape"],
                r["route"],
                f"{r['baseline_mib']:.0f}",
                f"{r['peak_over_mib']:.0f}",
                f"{r['settled_over_mib']:.0f}",
                answers,
            ]
        )
    header = ["router", "body", "route", "baseline MiB", "peak +MiB", "after 10 s +MiB", "answers"]
    return table(header, rows)
