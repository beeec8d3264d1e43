"""Scenarios ``overhead`` and ``peer``: what a gateway costs in front of a backend that
costs next to nothing (:mod:`benchmarks.fastfake`).

Every round starts each target afresh (new fake backends, and the gateway under test
in front of them) in the same order (A, B, C, A, B, C, ...), and drives it through
eight load levels, each after an unrecorded warm-up:

* ``whole-c1/8/64``: whole (non-streaming) answers at 1, 8 and 64 closed-loop clients;
* ``stream-c1/8/64``: 64-chunk streams whose chunks come 1 ms apart, as tokens do (each
  one reaches the gateway on its own unless the gateway falls behind);
* ``burst-c1/64``: 64-chunk streams sent back to back, as fast as the fake can write:
  the added time per chunk, and the most chunks per second one gateway process relays.

Two fakes run per round, one per kind of stream, registered as two models. For every
level it keeps the client's summary (:mod:`benchmarks.loadgen`) and the CPU time and
RSS of the gateway and of the backend (:mod:`benchmarks.meter`).

* ``overhead`` compares ``direct`` (the client on the fake itself) with ``slm_server``
  (the router, telemetry off) and ``slm_server_otel`` (telemetry on, no collector
  listening): added latency, added time to first chunk and per chunk, router CPU per
  request and per chunk, chunks per second through one router process, RSS.
* ``defaults`` compares ``slm_server`` with ``slm_server_default``, the defaults a user
  gets: spans exported to a local collector that answers 200
  (:mod:`benchmarks.otlp_sink`), metrics, the INFO access log.
* ``dashboard`` compares ``slm_server_pinned`` with ``slm_server_ui``, the same router
  with the dashboard open in a headless chromium (issue 14: the page must not slow the
  proxy path measurably); in both the router has the first CPU to itself and the load
  generator, the backends and the browser share the others
  (:func:`benchmarks.servers.pinned`).
* ``peer`` adds LiteLLM's proxy (one worker) on the same fakes: throughput ratios.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvloop

from benchmarks.loadgen import Workload, closed_loop
from benchmarks.meter import ProcessMeter
from benchmarks.report import DASH, TIMES, Check, pick, show, spread, table
from benchmarks.servers import (
    BENCH_MODEL,
    Server,
    bare_relay,
    fast_fake,
    litellm_proxy,
    slm_router,
    slm_router_pinned,
    slm_router_watched,
)

CONCURRENCY = (1, 8, 64)
BURST_CONCURRENCY = (1, 64)
BURST_MODEL = f"{BENCH_MODEL}-burst"


@dataclass(frozen=True)
class Cell:
    """One load level: ``kind`` is ``whole``, ``stream`` (paced) or ``burst``."""

    kind: str
    concurrency: int

    @property
    def key(self) -> str:
        return f"{self.kind}-c{self.concurrency}"

    @property
    def stream(self) -> bool:
        return self.kind != "whole"


CELLS = (
    *(Cell("whole", c) for c in CONCURRENCY),
    *(Cell("stream", c) for c in CONCURRENCY),
    *(Cell("burst", c) for c in BURST_CONCURRENCY),
)


@dataclass(frozen=True)
class Plan:
    """How long and how hard each scenario runs."""

    targets: tuple[str, ...]
    rounds: int = 3
    warmup: float = 1.0
    duration: float = 4.0
    chunks: int = 64
    # Seconds between the chunks of a paced stream.
    chunk_interval: float = 0.001


# Starts a gateway in front of the fakes; None means the client talks to them directly.
Starter = Callable[[Path, Sequence[Server]], AbstractContextManager[Server | None]]


@contextlib.contextmanager
def _direct(_workdir: Path, _backends: Sequence[Server]) -> Iterator[Server | None]:
    yield None


STARTERS: dict[str, Starter] = {
    "direct": _direct,
    "bare_relay": bare_relay,
    "slm_server": lambda workdir, backends: slm_router(workdir, backends, telemetry=False),
    "slm_server_otel": lambda workdir, backends: slm_router(workdir, backends, telemetry=True),
    "slm_server_default": lambda workdir, backends: slm_router(
        workdir, backends, telemetry=True, collector=True
    ),
    "slm_server_pinned": slm_router_pinned,
    "slm_server_ui": slm_router_watched,
    "litellm": litellm_proxy,
}
# Routers started from another checkout (``benchmarks.run --against REV``): a target
# ``slm_server@<short>`` is ``slm_server`` run from the tree of that commit, beside this one.
AGAINST: dict[str, Path] = {}
COMPARABLE = {
    "slm_server": {"telemetry": False},
    "slm_server_otel": {"telemetry": True},
    "slm_server_default": {"telemetry": True, "collector": True},
}
# Targets whose own starter runs another commit's router when given its tree.
COMPARABLE_STARTERS = {
    "slm_server_pinned": slm_router_pinned,
    "slm_server_ui": slm_router_watched,
}


def starter(name: str) -> Starter:
    """The starter of a target; ``<target>@<short>`` runs ``<target>`` from the tree of
    that commit (one of :data:`AGAINST`)."""
    base, _, revision = name.partition("@")
    if not revision:
        return STARTERS[name]
    tree = AGAINST[revision]
    own = COMPARABLE_STARTERS.get(base)
    if own is not None:
        return lambda workdir, backends: own(workdir, backends, tree=tree)
    options = COMPARABLE[base]
    telemetry, collector = options["telemetry"], options.get("collector", False)
    return lambda workdir, backends: slm_router(
        workdir, backends, telemetry=telemetry, collector=collector, tree=tree
    )


def with_against(targets: tuple[str, ...]) -> tuple[str, ...]:
    """``targets``, each comparable one followed by itself at every commit of
    :data:`AGAINST`, so the two run side by side in every round."""
    out: list[str] = []
    for target in targets:
        out.append(target)
        if target in COMPARABLE or target in COMPARABLE_STARTERS:
            out += [f"{target}@{revision}" for revision in AGAINST]
    return tuple(out)


def label_of(target: str) -> str:
    base, _, revision = target.partition("@")
    return f"{LABELS[base]} at {revision}" if revision else LABELS[base]


LABELS = {
    "direct": "direct",
    "bare_relay": "bare byte relay (the floor)",
    "slm_server": "slm_server",
    "slm_server_otel": "slm_server, telemetry on",
    "slm_server_default": "slm_server, defaults (spans to a collector)",
    "slm_server_pinned": "slm_server, pinned",
    "slm_server_ui": "slm_server, pinned, dashboard open",
    "litellm": "LiteLLM proxy",
}


async def measure_cell(
    gateway: Server | None, backend: Server, cell: Cell, plan: Plan
) -> dict[str, Any]:
    """Warm up, then measure one load level with the processes' CPU and memory."""
    server = gateway or backend
    workload = Workload(
        url=server.url, model=backend.model, stream=cell.stream, max_tokens=plan.chunks
    )
    summary = await measure_load(
        server, backend, workload, cell.concurrency, plan.warmup, plan.duration
    )
    return {"cell": cell.key, "kind": cell.kind, "concurrency": cell.concurrency} | summary


async def measure_load(
    server: Server,
    backend: Server,
    workload: Workload,
    concurrency: int,
    warmup: float,
    duration: float,
) -> dict[str, Any]:
    """``warmup`` seconds of ``workload`` unrecorded, then ``duration`` seconds recorded
    at ``concurrency`` closed-loop clients on ``server`` (the gateway, or ``backend``
    itself): the client's summary with the CPU time and memory of the server and the
    backend, and the server's CPU per request and per streamed token."""
    await closed_loop(workload, concurrency, duration=warmup)
    pids = {"server": server.pid}
    if backend.pid != server.pid:
        pids["backend"] = backend.pid
    if server.companion is not None:
        pids["companion"] = server.companion
    meter = ProcessMeter(pids)
    async with meter:
        run = await closed_loop(workload, concurrency, duration=duration)
    summary = run.summary()
    processes = meter.result()
    served = processes["server"]
    tokens = summary["tokens_per_s"] * summary["wall_s"]
    stream = workload.stream
    served["cpu_us_per_request"] = served["cpu_s"] / summary["ok"] * 1e6 if summary["ok"] else None
    served["cpu_us_per_chunk"] = served["cpu_s"] / tokens * 1e6 if stream and tokens else None
    summary["server"] = served
    summary["backend"] = processes.get("backend", served)
    if "companion" in processes:
        summary["companion"] = processes["companion"]
    return summary


def run_target(
    name: str, round_index: int, plan: Plan, workdir: Path, say: Callable[[str], None]
) -> dict[str, Any]:
    """Fresh servers for one target, all load levels, servers stopped."""
    workdir.mkdir(parents=True, exist_ok=True)
    with (
        fast_fake(workdir, plan.chunks, plan.chunk_interval, BENCH_MODEL) as paced,
        fast_fake(workdir, plan.chunks, 0.0, BURST_MODEL) as burst,
        starter(name)(workdir, [paced, burst]) as gateway,
    ):

        async def all_cells() -> list[dict[str, Any]]:
            return [
                await measure_cell(gateway, burst if cell.kind == "burst" else paced, cell, plan)
                for cell in CELLS
            ]

        cells = uvloop.run(all_cells())
    for cell in cells:
        say(f"  round {round_index} {name:16} {cell['cell']:10} {_brief(cell)}")
    return {"round": round_index, "target": name, "cells": cells}


def _brief(cell: dict[str, Any]) -> str:
    latency = cell["latency_ms"]["p50"]
    stream = cell["kind"] != "whole"
    cpu = cell["server"]["cpu_us_per_chunk" if stream else "cpu_us_per_request"]
    errors = f" errors {cell['errors']}" if cell["errors"] else ""
    return (
        f"{cell['throughput_rps']:8.1f} req/s  p50 {latency:8.2f} ms  "
        f"server CPU {cpu or 0:7.1f} µs/{'chunk' if stream else 'req'}  "
        f"client CPU {cell['client_cpu_share']:.0%}{errors}"
    )


def run_rounds(plan: Plan, workdir: Path, say: Callable[[str], None]) -> list[dict[str, Any]]:
    runs = []
    for round_index in range(1, plan.rounds + 1):
        for name in plan.targets:
            runs.append(
                run_target(name, round_index, plan, workdir / f"r{round_index}-{name}", say)
            )
    return runs


# ----------------------------------------------------------------- aggregation


class Rounds:
    """Measurements indexed by target, round and load level."""

    def __init__(self, runs: list[dict[str, Any]]) -> None:
        self.cells: dict[tuple[str, int, str], dict[str, Any]] = {
            (run["target"], run["round"], cell["cell"]): cell
            for run in runs
            for cell in run["cells"]
        }
        self.rounds = sorted({run["round"] for run in runs})

    def values(self, target: str, cell: str, path: str) -> list[float | None]:
        return [pick(self.cells.get((target, r, cell), {}), path) for r in self.rounds]

    def stat(self, target: str, cell: str, path: str) -> dict[str, Any]:
        return spread(self.values(target, cell, path))

    def paired(
        self,
        a: str,
        b: str,
        cell: str,
        path: str,
        combine: Callable[[float, float], float],
    ) -> dict[str, Any]:
        """``combine(a, b)`` within each round, then median [min-max] across rounds."""
        out: list[float | None] = []
        for va, vb in zip(self.values(a, cell, path), self.values(b, cell, path), strict=True):
            out.append(None if va is None or vb is None else combine(va, vb))
        return spread(out)

    def added(self, target: str, cell: str, path: str) -> dict[str, Any]:
        return self.paired(target, "direct", cell, path, lambda t, d: t - d)

    def ratio(self, a: str, b: str, cell: str, path: str) -> dict[str, Any]:
        return self.paired(a, b, cell, path, lambda x, y: x / y if y else float("nan"))


WHOLE = [f"whole-c{c}" for c in CONCURRENCY]
STREAM = [f"stream-c{c}" for c in CONCURRENCY]
BURST = [f"burst-c{c}" for c in BURST_CONCURRENCY]


def overhead_checks(rounds: Rounds, target: str) -> list[Check]:
    """The issue's targets for one gateway; the CPU ones at every load level, since on
    this machine they do not carry across levels (see docs/benchmarks.md)."""
    label = label_of(target)
    found = [
        Check(
            f"{label}: added p50 latency, whole answers, c=1",
            1.0,
            "ms",
            rounds.added(target, "whole-c1", "latency_ms.p50"),
        ),
        Check(
            f"{label}: added p50 time to first chunk, streams, c=1",
            1.0,
            "ms",
            rounds.added(target, "stream-c1", "ttft_ms.p50"),
        ),
    ]
    for c in CONCURRENCY:
        found.append(
            Check(
                f"{label}: CPU per whole answer, c={c}",
                500.0,
                "µs",
                rounds.stat(target, f"whole-c{c}", "server.cpu_us_per_request"),
            )
        )
    for c in CONCURRENCY:
        found.append(
            Check(
                f"{label}: CPU per streamed chunk, c={c}",
                40.0,
                "µs",
                rounds.stat(target, f"stream-c{c}", "server.cpu_us_per_chunk"),
            )
        )
    return found


def default_checks(rounds: Rounds) -> list[Check]:
    """The cost of the defaults against the lean configuration (issue 12, item 7)."""
    default, lean = LABELS["slm_server_default"], LABELS["slm_server"]
    return [
        Check(
            f"{default}: CPU per whole answer, c=1",
            350.0,
            "µs",
            rounds.stat("slm_server_default", "whole-c1", "server.cpu_us_per_request"),
        ),
        Check(
            f"{default}: added p50 latency, whole answers, c=1",
            0.35,
            "ms",
            rounds.added("slm_server_default", "whole-c1", "latency_ms.p50"),
        ),
        Check(
            f"{lean}: CPU per whole answer, c=1",
            250.0,
            "µs",
            rounds.stat("slm_server", "whole-c1", "server.cpu_us_per_request"),
        ),
        Check(
            f"{default}: CPU per streamed chunk, c=8",
            15.0,
            "µs",
            rounds.stat("slm_server_default", "stream-c8", "server.cpu_us_per_chunk"),
        ),
        Check(
            f"{lean}: CPU per streamed chunk, c=8",
            15.0,
            "µs",
            rounds.stat("slm_server", "stream-c8", "server.cpu_us_per_chunk"),
        ),
    ]


def peer_checks(rounds: Rounds) -> list[Check]:
    return [
        Check(
            f"throughput slm_server ÷ LiteLLM, {kind}, c=64",
            20.0,
            TIMES,
            rounds.ratio("slm_server", "litellm", f"{kind}-c64", "throughput_rps"),
            at_least=True,
        )
        for kind in ("whole", "stream", "burst")
    ]


def _ms(stat: dict[str, Any]) -> str:
    return show(stat, 2)


def _us(stat: dict[str, Any]) -> str:
    return show(stat, 0)


def overhead_tables(rounds: Rounds, targets: tuple[str, ...]) -> str:
    gateways = [t for t in targets if t != "direct"]
    parts = []
    header = ["gateway", "clients", "direct p50 (ms)", "added p50 (ms)", "added p99 (ms)"]
    header += ["req/s", "gateway CPU per request (µs)", "gateway RSS peak (MB)"]
    rows = []
    for target in gateways:
        for c in CONCURRENCY:
            cell = f"whole-c{c}"
            rows.append(
                [
                    label_of(target),
                    str(c),
                    _ms(rounds.stat("direct", cell, "latency_ms.p50")),
                    _ms(rounds.added(target, cell, "latency_ms.p50")),
                    _ms(rounds.added(target, cell, "latency_ms.p99")),
                    show(rounds.stat(target, cell, "throughput_rps"), 0),
                    _us(rounds.stat(target, cell, "server.cpu_us_per_request")),
                    show(rounds.stat(target, cell, "server.rss_mb_peak"), 0),
                ]
            )
    parts.append("Whole (non-streaming) answers:\n\n" + table(header, rows))
    header = ["gateway", "chunks", "clients", "direct TTFT p50 (ms)", "added TTFT p50 (ms)"]
    header += ["added per chunk (ms)", "added stream p50 (ms)", "chunks/s"]
    header += ["gateway CPU per chunk (µs)", "bare client CPU per chunk (µs)", "RSS peak (MB)"]
    rows = []
    for target in gateways:
        for cell in STREAM + BURST:
            kind, clients = cell.split("-c")
            rows.append(
                [
                    label_of(target),
                    "1 ms apart" if kind == "stream" else "back to back",
                    clients,
                    _ms(rounds.stat("direct", cell, "ttft_ms.p50")),
                    _ms(rounds.added(target, cell, "ttft_ms.p50")),
                    show(rounds.added(target, cell, "time_per_token_ms.p50"), 3),
                    _ms(rounds.added(target, cell, "latency_ms.p50")),
                    show(rounds.stat(target, cell, "tokens_per_s"), 0),
                    _us(rounds.stat(target, cell, "server.cpu_us_per_chunk")),
                    _us(rounds.stat("direct", cell, "client_cpu_us_per_token")),
                    show(rounds.stat(target, cell, "server.rss_mb_peak"), 0),
                ]
            )
    parts.append("64-chunk streams:\n\n" + table(header, rows))
    return "\n\n".join(parts)


def headroom_table(rounds: Rounds, targets: tuple[str, ...]) -> str:
    """Who used how much CPU: the client and the backend must not be the bottleneck."""
    header = ["target", "level", "client CPU share", "backend CPU share", "gateway CPU share"]
    companions = [t for t in targets if t.partition("@")[0] in COMPANIONS]
    for t in companions:
        base, _, revision = t.partition("@")
        header.append(f"{COMPANIONS[base]} CPU share" + (f" at {revision}" if revision else ""))
    rows = []
    for target in targets:
        for cell in WHOLE + STREAM + BURST:
            gateway = (
                DASH if target == "direct" else show(rounds.stat(target, cell, "server.cpu_share"))
            )
            row = [
                label_of(target),
                cell,
                show(rounds.stat(target, cell, "client_cpu_share")),
                show(rounds.stat(target, cell, "backend.cpu_share")),
                gateway,
            ]
            for other in companions:
                path = "companion.cpu_share"
                row.append(show(rounds.stat(target, cell, path)) if other == target else DASH)
            rows.append(row)
    return table(header, rows)


# What runs beside a target's gateway and is measured with it.
COMPANIONS = {"slm_server_ui": "browser"}


def change_beyond_noise(
    rounds: Rounds, changed: str, reference: str, cell: str, path: str, worse: float = 1.0
) -> dict[str, Any]:
    """How far ``changed``'s median moved from ``reference``'s, in units of what counts
    as noise: the larger of 5 % of the reference's median and the reference's own
    spread across rounds (max - min). ``worse`` is +1 when more is worse (CPU), -1 when
    less is (throughput); up to 1 is no measurable change for the worse."""
    mine, theirs = rounds.stat(changed, cell, path), rounds.stat(reference, cell, path)
    if mine["median"] is None or theirs["median"] is None:
        return spread([])
    noise = max(0.05 * theirs["median"], theirs["max"] - theirs["min"])
    moved = worse * (mine["median"] - theirs["median"])
    return spread([moved / noise if noise else 0.0])


def dashboard_checks(rounds: Rounds) -> list[Check]:
    """The page open must not slow the proxy path measurably (issue 14): at every load
    level, the gateway's CPU per answer or chunk no higher, and its throughput no
    lower, than the same router's with no page open by more than the noise
    (:func:`change_beyond_noise`)."""
    found = []
    open_, closed = "slm_server_ui", "slm_server_pinned"
    for cell in WHOLE + STREAM:
        unit = "server.cpu_us_per_chunk" if cell in STREAM else "server.cpu_us_per_request"
        what = "chunk" if cell in STREAM else "whole answer"
        kind = "streams" if cell in STREAM else "whole answers"
        level = cell.split("-c")[1]
        found.append(
            Check(
                f"dashboard open: gateway CPU per {what}, c={level}, more than closed ÷ noise",
                1.0,
                TIMES,
                change_beyond_noise(rounds, open_, closed, cell, unit),
            )
        )
        slower = change_beyond_noise(rounds, open_, closed, cell, "throughput_rps", worse=-1.0)
        found.append(
            Check(
                f"dashboard open: throughput, {kind}, c={level}, less than closed ÷ noise",
                1.0,
                TIMES,
                slower,
            )
        )
    return found


def peer_table(rounds: Rounds) -> str:
    header = ["level", "slm_server req/s", "LiteLLM req/s", "ratio", "slm_server p50 (ms)"]
    header += ["LiteLLM p50 (ms)", "slm_server CPU/req (µs)", "LiteLLM CPU/req (µs)"]
    rows = []
    for cell in WHOLE + STREAM + BURST:
        rows.append(
            [
                cell,
                show(rounds.stat("slm_server", cell, "throughput_rps"), 1),
                show(rounds.stat("litellm", cell, "throughput_rps"), 1),
                show(rounds.ratio("slm_server", "litellm", cell, "throughput_rps"), 1),
                _ms(rounds.stat("slm_server", cell, "latency_ms.p50")),
                _ms(rounds.stat("litellm", cell, "latency_ms.p50")),
                _us(rounds.stat("slm_server", cell, "server.cpu_us_per_request")),
                _us(rounds.stat("litellm", cell, "server.cpu_us_per_request")),
            ]
        )
    return table(header, rows)


def csv_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {"round": run["round"], "target": run["target"]} | cell
        for run in runs
        for cell in run["cells"]
    ]
