"""The mixed-load test at full length: ten minutes of valid load on the real
llama-server with the watchdog's tightest thresholds, as a benchmark.

    uv run python -m benchmarks.mixed_load [--seconds 600]

The test suite runs the same test (``tests/integration/test_mixed_load.py``) for two
minutes; this runs it for ``--seconds`` and writes what it saw to
``benchmarks/results/mixed-load-<date>.md`` and ``.json``: how every kind of request
ended, what the watchdog did (it must restart nothing), and the router's memory and
descriptors a third of the way in and at the end. Exits with the test's status.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from benchmarks.machine import ROOT, describe_machine
from benchmarks.report import write_measurements

TEST = "tests/integration/test_mixed_load.py"


def run(seconds: float) -> tuple[int, str, float]:
    """The test's exit status, its output and its wall time."""
    env = {**os.environ, "SLM_TEST_MIXED_LOAD_SECONDS": str(seconds)}
    started = time.monotonic()
    done = subprocess.run(  # noqa: S603
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", TEST],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    return done.returncode, done.stdout + done.stderr, time.monotonic() - started


def findings(output: str) -> dict[str, Any]:
    """The lines the test prints about the run, parsed."""
    found: dict[str, Any] = {}
    summary = re.search(r"mixed load for (\d+) s: (\{.*\})", output)
    if summary:
        found["seconds"] = int(summary.group(1))
        pairs = re.findall(r"'([\w:]+)': (\d+)", summary.group(2))
        found["endings"] = {key: int(count) for key, count in pairs}
    router = re.search(
        r"router after a third: ([\d.]+) MB, (\d+) fds; at the end: ([\d.]+) MB, (\d+) fds",
        output,
    )
    if router:
        found["router"] = {
            "rss_mb_after_a_third": float(router.group(1)),
            "fds_after_a_third": int(router.group(2)),
            "rss_mb_at_end": float(router.group(3)),
            "fds_at_end": int(router.group(4)),
        }
    watchdog = re.search(r"watchdog: (.*)", output)
    if watchdog:
        found["watchdog"] = watchdog.group(1).strip()
    return found


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"# Mixed load, {result['date']}",
        "",
        f"`python -m benchmarks.mixed_load --seconds {result['asked_seconds']:.0f}` "
        f"at `{result['machine'].get('commit', '?')}`: "
        f"{'passed' if result['status'] == 0 else 'FAILED'} "
        f"in {result['wall_seconds']:.0f} s.",
        "",
        "| request kind : ending | count |",
        "|---|---|",
    ]
    for key, count in sorted(result.get("endings", {}).items()):
        lines.append(f"| {key} | {count} |")
    router = result.get("router")
    if router:
        lines += [
            "",
            f"Router: {router['rss_mb_after_a_third']} MB and {router['fds_after_a_third']} "
            f"descriptors a third of the way in; {router['rss_mb_at_end']} MB and "
            f"{router['fds_at_end']} at the end.",
        ]
    if "watchdog" in result:
        lines += ["", f"Watchdog: {result['watchdog']}."]
    machine = result["machine"]
    lines += [
        "",
        f"Machine: {machine.get('cpu_model', '?')}, {machine.get('logical_cpus', '?')} "
        f"logical CPUs, load {machine.get('load_1m', '?')} at the start.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600.0)
    args = parser.parse_args(argv)
    machine = describe_machine()
    status, output, wall = run(args.seconds)
    date = datetime.date.today().isoformat()
    result: dict[str, Any] = {
        "date": date,
        "asked_seconds": args.seconds,
        "status": status,
        "wall_seconds": round(wall, 1),
        "machine": machine,
        **findings(output),
    }
    write_measurements("mixed-load", result, markdown(result))
    print(markdown(result))
    if status != 0:
        print(output[-4000:])
    return status


if __name__ == "__main__":
    raise SystemExit(main())
