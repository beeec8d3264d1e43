r"""Instructions the router executes per whole answer and per streamed chunk, counted
with callgrind, for this work tree and, side by side, for another commit.

    uv run python -m benchmarks.instructions                  # this work tree
    uv run python -m benchmarks.instructions --against HEAD~3 # and that commit beside it
    uv run python -m benchmarks.instructions --requests 500 --write

CPU time on a shared virtual machine drifts by 10 % or more from run to run, and by
more from one machine to the next; a count of instructions repeats within a fraction of
a percent, so a change of a few percent in what the router does per request can be
seen at all. What it leaves out is the kernel's share (system calls, the loopback's
work) and how fast the instructions run; the CPU-time scenarios (``benchmarks.run``)
measure those.

Each variant is the lean router (telemetry off, metrics and the access log on) in front
of the fast fake backend, run under ``valgrind --tool=callgrind`` with counting off
until the warm-up is done; then it counts ``--requests`` whole answers at 1 client, and
``--streams`` streams of 64 chunks at 8 clients, twice: with the chunks ``--spacing``
seconds apart (the router, slowed some fifty times by valgrind, still reads them one by
one, as it does at full speed) and back to back (reads hold many events at once, as when
a client reads slower than the backend writes). Another commit is checked out into a
temporary git worktree and runs from there with this environment. valgrind is Debian's
``valgrind`` package; nothing else is needed.

``--write`` keeps the table in ``benchmarks/results/instructions-<date>.{md,json}``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import uvloop
import yaml

from benchmarks.loadgen import Workload, closed_loop
from benchmarks.machine import ROOT, describe_machine
from benchmarks.report import RESULTS, table
from benchmarks.servers import bench_entry, fast_fake, router_env
from tests.processes import free_port, http_ok, poll, start_command

CHUNKS = 64


def count(root: Path, workdir: Path, *, stream: bool, runs: int, spacing: float) -> float:
    """Instructions per whole answer (or per chunk) of the router in ``root``."""
    workdir.mkdir(parents=True, exist_ok=True)
    with fast_fake(workdir, chunks=CHUNKS, interval=spacing) as backend:
        registry = {"models": {backend.model: bench_entry(backend.model, backend.port)}}
        (workdir / "models.yaml").write_text(yaml.safe_dump(registry, sort_keys=False))
        port = free_port()
        env = {**router_env(workdir, telemetry=False), "SLM_ROUTER_PORT": str(port)}
        out = workdir / "callgrind.out"
        valgrind = ["valgrind", "--tool=callgrind", "--instr-atstart=no"]
        valgrind.append(f"--callgrind-out-file={out}")
        router = start_command("router", env, workdir / "router.log", prefix=valgrind, cwd=root)
        try:
            url = f"http://127.0.0.1:{port}"
            poll(lambda: http_ok(f"{url}/health") or router.popen.poll() is not None, 180, "router")
            if router.popen.poll() is not None:
                raise SystemExit(f"the router exited: {router.text()}")
            work = Workload(url=url, model=backend.model, stream=stream, max_tokens=CHUNKS)
            clients = 8 if stream else 1
            uvloop.run(closed_loop(work, clients, requests=max(8, runs // 2)))
            _control(router.pid, "on")
            run = uvloop.run(closed_loop(work, clients, requests=runs))
            _control(router.pid, "off")
        finally:
            router.stop(timeout=120)  # callgrind writes its counts as the router exits
    answered = int(run.summary()["ok"])
    if answered != runs:
        raise SystemExit(f"{runs - answered} of {runs} requests failed")
    return _total(out) / (answered * (CHUNKS if stream else 1))


def _control(pid: int, instrumentation: str) -> None:
    subprocess.run(  # noqa: S603 - fixed arguments and our router's pid
        ["callgrind_control", "-i", instrumentation, str(pid)],
        check=True,
        capture_output=True,
    )


def _total(out: Path) -> int:
    """The instructions counted in callgrind's output files: one per dump, each
    counting from the one before (a file may state its count as both its summary and
    its totals)."""
    total = 0
    for path in out.parent.glob(f"{out.name}*"):
        counts = [
            int(line.split()[1])
            for line in path.read_text().splitlines()
            if line.startswith(("summary:", "totals:"))
        ]
        total += max(counts, default=0)
    return total


@contextlib.contextmanager
def checkout(revision: str) -> Iterator[tuple[Path, str]]:
    """``revision`` in a temporary git worktree; yields its root and short commit."""

    def git(*args: str) -> str:
        done = subprocess.run(  # noqa: S603 - fixed arguments
            ["git", *args],
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        )
        return done.stdout.strip()

    short = git("rev-parse", "--short", revision)
    place = Path(tempfile.mkdtemp(prefix="bench-instructions-"))
    git("worktree", "add", "--detach", str(place / "tree"), short)
    try:
        yield place / "tree", short
    finally:
        git("worktree", "remove", "--force", str(place / "tree"))
        shutil.rmtree(place, ignore_errors=True)


def measure(root: Path, args: argparse.Namespace, workdir: Path) -> dict[str, float]:
    return {
        "whole": count(root, workdir / "whole", stream=False, runs=args.requests, spacing=0.0),
        "chunk, spaced": count(
            root, workdir / "spaced", stream=True, runs=args.streams, spacing=args.spacing
        ),
        "chunk, back to back": count(
            root, workdir / "packed", stream=True, runs=args.streams, spacing=0.0
        ),
    }


def render(results: dict[str, dict[str, float]]) -> str:
    names = list(results)
    rows = []
    for measure_name in next(iter(results.values())):
        cells = [f"{results[n][measure_name]:,.0f}" for n in names]
        if len(names) == 2:
            a, b = (results[n][measure_name] for n in names)
            cells.append(f"{(b - a) / a:+.1%}")
        rows.append((measure_name, *cells))
    header = ["instructions per", *names] + (["change"] if len(names) == 2 else [])
    return table(header, rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", help="a commit to count beside this work tree")
    parser.add_argument("--requests", type=int, default=300, help="whole answers counted")
    parser.add_argument("--streams", type=int, default=40, help="streams counted, each way")
    parser.add_argument("--spacing", type=float, default=0.02, help="seconds between chunks")
    parser.add_argument("--write", action="store_true", help="keep the table in results/")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    machine = describe_machine()
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-instructions-") as tmp:
        workdir = Path(tmp)
        if args.against:
            with checkout(args.against) as (tree, short):
                results[short] = measure(tree, args, workdir / "against")
        results[machine["commit"]] = measure(ROOT, args, workdir / "this")
    text = render(results)
    print(text)
    if args.write:
        stem = f"instructions-{datetime.date.today().isoformat()}"
        RESULTS.mkdir(parents=True, exist_ok=True)
        report: dict[str, Any] = {"machine": machine, "config": vars(args), "results": results}
        (RESULTS / f"{stem}.json").write_text(json.dumps(report, indent=1) + "\n")
        heading = (
            f"# Instructions per answer (callgrind)\n\n`python -m benchmarks.instructions "
            f"{' '.join(argv if argv is not None else sys.argv[1:])}`; "
            f"{machine['cpu_model']}, Python {machine['python']}, {machine['date']}.\n\n"
        )
        (RESULTS / f"{stem}.md").write_text(heading + text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
