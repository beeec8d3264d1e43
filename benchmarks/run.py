"""Run benchmark scenarios on fresh servers and write their results.

    uv run python -m benchmarks.run overhead peer        # fake backend, ~5 + ~7 minutes
    uv run python -m benchmarks.run defaults             # lean and default configuration
    uv run python -m benchmarks.run dashboard            # with and without the dashboard open
    uv run python -m benchmarks.run real recovery        # llama-server with the default models
    uv run python -m benchmarks.run frozen --against HEAD~1 --rounds 2  # SIGSTOP, defaults
    uv run python -m benchmarks.run progress_cost --against HEAD~1  # progress, router CPU
    uv run python -m benchmarks.run api_shapes           # /api/chat beside chat completions
    uv run python -m benchmarks.run swap                 # models on demand: a cold load, a swap
    uv run python -m benchmarks.run reload               # reloading the registry under load
    uv run python -m benchmarks.run resume               # a 6k-token prefix after a swap
    uv run python -m benchmarks.run body_burst --against HEAD~5  # router memory, huge bodies
    uv run python -m benchmarks.run affinity             # routing policies on two replicas
    uv run python -m benchmarks.run agent_request        # a 20k-token agent request, 3 shapes
    uv run python -m benchmarks.run overhead --quick     # a short run to try things out
    uv run python -m benchmarks.run defaults --against HEAD~3  # that commit's router beside

Each scenario first waits (up to ``--max-wait`` seconds) for the 1-minute load average
to drop below ``--quiet-load``, then runs its rounds — every run on newly started
servers, the compared targets interleaved — and writes
``benchmarks/results/<scenario>-<date>.json`` (every measurement, the machine, the load),
``.md`` (medians with [min-max] across rounds, and the targets) and ``.csv`` (one row per
round, target and load level). The summary printed at the end says which targets passed;
the exit status is 1 only with ``--strict`` and a missed target.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from benchmarks import (
    affinity,
    agent_request,
    api_shapes,
    body_burst,
    frozen,
    overhead,
    progress_cost,
    real,
    recovery,
    reload,
    resume,
    swap,
)
from benchmarks.instructions import checkout
from benchmarks.machine import describe_machine, load_average, source_digest, wait_for_quiet
from benchmarks.report import DASH, Check, checks_table, machine_line, show, write_results
from benchmarks.servers import litellm_version
from tests.integration.watched import FAST_WATCHDOG

Say = Callable[[str], None]


@dataclass
class Outcome:
    """What a scenario hands back to be written."""

    title: str
    config: dict[str, Any]
    runs: list[dict[str, Any]]
    checks: list[Check]
    markdown: str
    rows: list[dict[str, Any]]
    # Measured values shown in the summary without a target.
    headlines: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


def _fake_plan(targets: tuple[str, ...], quick: bool, rounds: int) -> overhead.Plan:
    plan = overhead.Plan(targets=overhead.with_against(targets), rounds=rounds)
    return replace(plan, warmup=0.3, duration=1.0) if quick else plan


def run_overhead(quick: bool, rounds: int, workdir: Path, say: Say) -> Outcome:
    plan = _fake_plan(("direct", "slm_server", "slm_server_otel"), quick, rounds)
    runs = overhead.run_rounds(plan, workdir, say)
    found = overhead.Rounds(runs)
    checks = overhead.overhead_checks(found, "slm_server")
    checks += overhead.overhead_checks(found, "slm_server_otel")
    markdown = "\n\n".join(
        [
            overhead.overhead_tables(found, plan.targets),
            "CPU used by each process, in cores (CPU seconds per wall second):",
            overhead.headroom_table(found, plan.targets),
        ]
    )
    return Outcome(
        "Overhead: slm_server in front of a fast fake backend",
        asdict(plan),
        runs,
        checks,
        markdown,
        overhead.csv_rows(runs),
    )


def run_defaults(quick: bool, rounds: int, workdir: Path, say: Say) -> Outcome:
    plan = _fake_plan(("direct", "bare_relay", "slm_server", "slm_server_default"), quick, rounds)
    runs = overhead.run_rounds(plan, workdir, say)
    found = overhead.Rounds(runs)
    markdown = "\n\n".join(
        [
            overhead.overhead_tables(found, plan.targets),
            "CPU used by each process, in cores (CPU seconds per wall second):",
            overhead.headroom_table(found, plan.targets),
        ]
    )
    return Outcome(
        "Defaults: slm_server lean (telemetry off) and with the defaults (spans to a collector)",
        asdict(plan),
        runs,
        overhead.default_checks(found),
        markdown,
        overhead.csv_rows(runs),
    )


def run_dashboard(quick: bool, rounds: int, workdir: Path, say: Say) -> Outcome:
    plan = _fake_plan(("direct", "slm_server_pinned", "slm_server_ui"), quick, rounds)
    runs = overhead.run_rounds(plan, workdir, say)
    found = overhead.Rounds(runs)
    checks = overhead.dashboard_checks(found)
    markdown = "\n\n".join(
        [
            overhead.overhead_tables(found, plan.targets),
            "CPU used by each process, in cores (CPU seconds per wall second):",
            overhead.headroom_table(found, plan.targets),
        ]
    )
    return Outcome(
        "Dashboard: slm_server with and without the dashboard open",
        asdict(plan),
        runs,
        checks,
        markdown,
        overhead.csv_rows(runs),
    )


def run_peer(quick: bool, rounds: int, workdir: Path, say: Say) -> Outcome:
    plan = _fake_plan(("direct", "slm_server", "litellm"), quick, rounds)
    runs = overhead.run_rounds(plan, workdir, say)
    found = overhead.Rounds(runs)
    markdown = "\n\n".join(
        [
            overhead.peer_table(found),
            overhead.overhead_tables(found, plan.targets),
            "CPU used by each process, in cores (CPU seconds per wall second):",
            overhead.headroom_table(found, plan.targets),
        ]
    )
    return Outcome(
        f"Peer: slm_server and LiteLLM's proxy ({litellm_version()}) on the same fake backend",
        asdict(plan) | {"litellm": litellm_version()},
        runs,
        overhead.peer_checks(found),
        markdown,
        overhead.csv_rows(runs),
    )


def run_real(quick: bool, rounds: int, workdir: Path, say: Say) -> Outcome:
    plan = real.Plan(rounds=rounds)
    if quick:
        plan = replace(plan, max_tokens=16, requests=((1, 2), (4, 4)), warmup=1)
    runs = real.run_rounds(plan, workdir, say)
    found = overhead.Rounds(runs)
    return Outcome(
        "Real model: Gemma 3 270M on llama-server, directly and through slm_server",
        asdict(plan),
        runs,
        [],
        real.tables(found, plan),
        overhead.csv_rows(runs),
        real.headlines(found, plan),
    )


def run_recovery(quick: bool, rounds: int, workdir: Path, say: Say) -> Outcome:
    plan = recovery.Plan(trials=1 if quick else max(rounds, 5))
    trials = recovery.run_trials(plan, workdir, say)
    return Outcome(
        "Recovery: kill -9 and SIGSTOP of llama-server (SmolLM2 135M), and a stalled backend",
        asdict(plan) | {"watchdog": FAST_WATCHDOG, "confirm_seconds": recovery.CONFIRM_SECONDS},
        trials,
        recovery.checks(trials),
        recovery.tables(trials),
        trials,
    )


def run_frozen(quick: bool, rounds: int, workdir: Path, say: Say) -> Outcome:
    plan = frozen.Plan(rounds=1 if quick else rounds)
    trials = frozen.run_trials(plan, workdir, say)
    return Outcome(
        "A frozen llama-server (SIGSTOP, SmolLM2 135M) under the shipped watchdog settings",
        asdict(plan) | {"grace_seconds": frozen.GRACE_SECONDS, "clients": frozen.CLIENTS},
        trials,
        [],
        frozen.tables(trials),
        [{k: v for k, v in t.items() if k not in ("outcomes", "failures")} for t in trials],
    )


def run_progress_cost(quick: bool, rounds: int, workdir: Path, say: Say) -> Outcome:
    plan = progress_cost.Plan(rounds=1 if quick else rounds, requests=20 if quick else 100)
    trials = progress_cost.run_trials(plan, workdir, say)
    return Outcome(
        "What reading the engine's progress costs the router (fake llama-server)",
        asdict(plan)
        | {
            "chunks": progress_cost.CHUNKS,
            "short_read_seconds": progress_cost.SHORT_READ_SECONDS,
            "long_read_seconds": progress_cost.LONG_READ_SECONDS,
            "long_report_seconds": progress_cost.LONG_REPORT_SECONDS,
        },
        trials,
        [],
        progress_cost.tables(trials),
        trials,
    )


def run_api_shapes(quick: bool, rounds: int, workdir: Path, say: Say) -> Outcome:
    plan = api_shapes.Plan(rounds=1 if quick else rounds, blocks=2 if quick else 10)
    trials = api_shapes.run_trials(plan, workdir, say)
    return Outcome(
        "Ollama's /api/chat beside chat completions through the router (fake llama-server)",
        asdict(plan) | {"chunks": api_shapes.CHUNKS, "block": api_shapes.BLOCK},
        trials,
        api_shapes.checks(trials),
        api_shapes.tables(trials),
        trials,
    )


def run_swap(quick: bool, rounds: int, workdir: Path, say: Say) -> Outcome:
    plan = swap.Plan(trials=1 if quick else max(rounds, 5))
    trials = swap.run_trials(plan, workdir, say)
    return Outcome(
        "Models on demand: a cold load and a swap on llama-server (SmolLM2 135M, Gemma 3 270M)",
        asdict(plan) | {"one_model_budget_mb": swap.ONE_MODEL_BUDGET_MB},
        trials,
        swap.checks(trials),
        swap.tables(trials),
        trials,
    )


def run_reload(quick: bool, rounds: int, workdir: Path, say: Say) -> Outcome:
    plan = reload.Plan(trials=1 if quick else max(rounds, 3))
    trials = reload.run_trials(plan, workdir, say)
    return Outcome(
        "Reloading the registry under load on llama-server (SmolLM2 135M, Gemma 3 270M)",
        asdict(plan),
        trials,
        reload.checks(trials),
        reload.tables(trials),
        trials,
    )


def run_resume(quick: bool, rounds: int, workdir: Path, say: Say) -> Outcome:
    plan = resume.Plan(trials=1 if quick else max(rounds, 3))
    trials = resume.run_trials(plan, workdir, say)
    return Outcome(
        "Resume: a 6k-token prefix after a swap away and back, with and without the slot "
        "cache (llama-server, SmolLM2 135M and Gemma 3 270M)",
        asdict(plan) | {"one_model_budget_mb": resume.ONE_MODEL_BUDGET_MB},
        trials,
        resume.checks(trials),
        resume.tables(trials),
        trials,
    )


def run_body_burst(quick: bool, rounds: int, workdir: Path, say: Say) -> Outcome:
    plan = body_burst.Plan(rounds=1)
    if quick:
        plan = replace(plan, shapes=("strings",), routes=("/v1/chat/completions",))
    runs = body_burst.run_rounds(plan, workdir, say)
    return Outcome(
        "Router memory under bursts of eight 30 MiB bodies (default limits, fast fake)",
        asdict(plan),
        runs,
        body_burst.checks(runs),
        body_burst.tables(runs),
        runs,
    )


def run_affinity(quick: bool, rounds: int, workdir: Path, say: Say) -> Outcome:
    plan = affinity.Plan(rounds=rounds)
    if quick:
        plan = replace(plan, rounds=1, turns=2)
    runs = affinity.run_rounds(plan, workdir, say)
    return Outcome(
        "Affinity: round robin, least outstanding and prefix affinity over two llama-server "
        "replicas (SmolLM2 135M)",
        asdict(plan),
        runs,
        affinity.checks(runs),
        affinity.tables(runs, plan),
        affinity.csv_rows(runs),
    )


def run_agent_request(quick: bool, rounds: int, workdir: Path, say: Say) -> Outcome:
    plan = agent_request.QUICK if quick else agent_request.Plan(rounds=rounds)
    bodies, runs = agent_request.run_rounds(plan, workdir, say)
    found = overhead.Rounds(runs)
    return Outcome(
        "Agent-sized request: what slm_server adds on each API shape, beside the fast fake "
        "asked directly",
        asdict(plan) | {"preset": agent_request.PRESET, "bodies": bodies.sizes()},
        runs,
        agent_request.checks(found, plan),
        agent_request.tables(found, plan, bodies),
        overhead.csv_rows(runs),
        agent_request.headlines(found, plan),
    )


SCENARIOS: dict[str, Callable[[bool, int, Path, Say], Outcome]] = {
    "overhead": run_overhead,
    "defaults": run_defaults,
    "dashboard": run_dashboard,
    "peer": run_peer,
    "real": run_real,
    "recovery": run_recovery,
    "frozen": run_frozen,
    "progress_cost": run_progress_cost,
    "api_shapes": run_api_shapes,
    "swap": run_swap,
    "reload": run_reload,
    "resume": run_resume,
    "body_burst": run_body_burst,
    "affinity": run_affinity,
    "agent_request": run_agent_request,
}


def run_scenario(name: str, args: argparse.Namespace, say: Say) -> Outcome:
    load = (
        {"load_when_measuring": load_average(), "waited_s": 0}
        if args.no_wait
        else wait_for_quiet(args.quiet_load, args.max_wait, say)
    )
    machine = describe_machine()
    say(f"{name}: load {load['load_when_measuring']}, commit {machine['commit']}")
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
    try:
        outcome = SCENARIOS[name](args.quick, args.rounds, workdir, say)
    finally:
        if args.keep:
            say(f"kept the servers' files in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    report: dict[str, Any] = {
        "scenario": name,
        "title": outcome.title,
        "machine": machine,
        "load": load,
        "load_after": load_average(),
        "source_digest_after": source_digest(),
        "duration_s": round(time.monotonic() - started),
        "quick": args.quick,
        "config": outcome.config,
        "checks": [c.as_dict() for c in outcome.checks],
        "headlines": {name: stat for name, stat in outcome.headlines},
        "runs": outcome.runs,
    }
    markdown = "\n\n".join(
        [
            f"# {outcome.title}",
            machine_line(report)
            + f" {len({r.get('round', r.get('trial')) for r in outcome.runs})} rounds, "
            f"{report['duration_s']} s in all; medians with [min{DASH}max] across rounds.",
            outcome.markdown,
        ]
        + (["## Targets", checks_table(outcome.checks)] if outcome.checks else [])
    )
    if args.quick:
        say(f"--quick: results not written; they would read:\n\n{markdown}\n")
    else:
        for path in write_results(name, report, markdown, outcome.rows):
            say(f"wrote {path}")
    return outcome


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", nargs="+", choices=sorted(SCENARIOS))
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (≥ 3)")
    parser.add_argument("--quick", action="store_true", help="short runs, nothing written")
    parser.add_argument("--no-wait", action="store_true", help="do not wait for a quiet machine")
    parser.add_argument("--quiet-load", type=float, default=1.0)
    parser.add_argument("--max-wait", type=float, default=1200.0, help="seconds")
    parser.add_argument("--keep", action="store_true", help="keep the servers' logs")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument(
        "--against",
        metavar="REV",
        help="also run the router of this commit beside this tree's, in the same rounds "
        "(overhead, defaults, dashboard, body_burst, agent_request, frozen and progress_cost)",
    )
    args = parser.parse_args(argv)

    def say(line: str) -> None:
        print(line, flush=True)

    with contextlib.ExitStack() as trees:
        if args.against:
            tree, short = trees.enter_context(checkout(args.against))
            overhead.AGAINST[short] = tree
        results = {name: run_scenario(name, args, say) for name in args.scenarios}
    say("\nsummary")
    for name, outcome in results.items():
        for check in outcome.checks:
            say(f"  {name:9} {check.line()}")
        for headline, stat in outcome.headlines:
            say(f"  {name:9} info  {headline}: {show(stat, 3)}")
    missed = any(not c.passed for outcome in results.values() for c in outcome.checks)
    return 1 if missed and args.strict else 0


if __name__ == "__main__":
    raise SystemExit(main())
