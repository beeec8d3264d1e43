r"""Profile the router under load: where its CPU time goes, by function.

    uv run python -m benchmarks.profile [--stream [--chunks 64]] [--concurrency 8] [--seconds 10] \
        [--telemetry [--collector]]

Starts the fast fake backend and the router, drives the router with the load generator,
and samples the router's Python stacks meanwhile with py-spy (run through ``uvx``, so it
is never a project dependency; sampling another process needs ptrace rights, which root
has). Prints the functions holding the most samples, inclusive and self, and keeps the
raw collapsed stacks (``--out``, for flamegraph tools).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import uvloop

from benchmarks.loadgen import Workload, closed_loop
from benchmarks.servers import fast_fake, slm_router


def py_spy() -> list[str]:
    """py-spy itself when it is on ``PATH``, else through ``uvx`` (never a dependency);
    uv's own directory counts, where ``scripts/setup.sh`` installs it."""
    found = shutil.which("py-spy")
    if found is not None:
        return [found]
    uv_bins = sorted(Path.home().glob(".cache/slm_server/uv/*/bin"))
    uvx = shutil.which("uvx") or next(
        (str(d / "uvx") for d in reversed(uv_bins) if (d / "uvx").exists()), None
    )
    if uvx is None:
        raise SystemExit("py-spy is not on PATH and there is no uvx to run it with")
    return [uvx, "py-spy"]


def frame_name(frame: str) -> str:
    """``function (module.py)`` from py-spy's ``function (path/to/module.py:line)``."""
    if " (" not in frame:
        return frame
    function, where = frame.split(" (", 1)
    return f"{function} ({where.split(':', 1)[0].rsplit('/', 1)[-1]})"


def summarise(collapsed: str, top: int) -> str:
    """Inclusive and self shares of samples per function, from collapsed stacks."""
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = [frame_name(f) for f in stack.split(";")]
        for name in set(frames):
            inclusive[name] += count
        own[frames[-1]] += count
    if not total:
        return "no samples"
    lines = [f"{total} samples", "", "inclusive:"]
    lines += [f"  {n / total:6.1%}  {name}" for name, n in inclusive.most_common(top)]
    lines += ["", "self:"]
    lines += [f"  {n / total:6.1%}  {name}" for name, n in own.most_common(top)]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument("--telemetry", action="store_true", help="OTLP export, no collector")
    parser.add_argument(
        "--collector", action="store_true", help="with --telemetry: to a local sink answering 200"
    )
    parser.add_argument("--chunk-interval", type=float, default=0.001)
    parser.add_argument("--chunks", type=int, default=64, help="chunks per streamed answer")
    parser.add_argument("--top", type=int, default=45)
    parser.add_argument("--out", type=Path, default=Path("/tmp/slm-router-profile.txt"))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-profile-") as tmp:
        workdir = Path(tmp)
        with (
            fast_fake(workdir, chunks=args.chunks, interval=args.chunk_interval) as backend,
            slm_router(
                workdir, [backend], telemetry=args.telemetry, collector=args.collector
            ) as router,
        ):
            workload = Workload(
                url=router.url, model=backend.model, stream=args.stream, max_tokens=args.chunks
            )
            uvloop.run(closed_loop(workload, args.concurrency, duration=1.0))
            spy = [*py_spy(), "record", "--pid", str(router.pid), "--format", "raw"]
            spy += ["--rate", str(args.rate), "--duration", str(int(args.seconds))]
            spy += ["--output", str(args.out)]
            sampler = subprocess.Popen(  # noqa: S603 - fixed arguments and our router's pid
                spy, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
            )
            time.sleep(1.0)  # py-spy attaches
            run = uvloop.run(closed_loop(workload, args.concurrency, duration=args.seconds))
            sampler.wait(timeout=60)
    summary = run.summary()
    print(
        f"{summary['ok']} requests, {summary['throughput_rps']:.1f} req/s, "
        f"p50 {summary['latency_ms']['p50']:.2f} ms; stacks in {args.out}\n"
    )
    print(summarise(args.out.read_text(), args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
