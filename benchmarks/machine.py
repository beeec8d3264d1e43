"""The machine a benchmark ran on, and waiting until it is quiet enough to measure.

describe_machine()   # commit, CPU model, cores, memory, OS, Python, load average
wait_for_quiet(1.0, max_wait=1200, report=print)
"""

from __future__ import annotations

import datetime
import hashlib
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent


def commit() -> str:
    """The short commit of the work tree, with ``+dirty`` when it has changes."""

    def git(*args: str) -> str:
        argv = ["git", *args]
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False)  # noqa: S603
        return done.stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return f"{head}+dirty" if git("status", "--porcelain", "--untracked-files=no") else head


def source_digest() -> str:
    """A short hash of the gateway's source as it is on disk: the work tree can change
    between the start and the end of a run when others edit it."""
    digest = hashlib.sha256()
    for path in sorted((ROOT / "slm_server").rglob("*.py")):
        digest.update(path.relative_to(ROOT).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> tuple[float, float, float]:
    one, five, fifteen = os.getloadavg()
    return round(one, 2), round(five, 2), round(fifteen, 2)


def describe_machine() -> dict[str, Any]:
    one, five, fifteen = load_average()
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": commit(),
        "source_digest": source_digest(),
        "cpu_model": cpu_model(),
        "logical_cpus": psutil.cpu_count(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "load_1m": one,
        "load_5m": five,
        "load_15m": fifteen,
    }


def wait_for_quiet(
    threshold: float,
    max_wait: float,
    report: Callable[[str], None],
    poll_seconds: float = 30.0,
) -> dict[str, Any]:
    """Wait until the 1-minute load average is below ``threshold``, at most
    ``max_wait`` seconds; returns what was seen (the run goes on either way)."""
    started = time.monotonic()
    first = load_average()
    while True:
        now = load_average()
        waited = time.monotonic() - started
        if now[0] < threshold:
            break
        if waited >= max_wait:
            report(f"load {now[0]} still >= {threshold} after {waited:.0f}s; measuring anyway")
            break
        report(f"load {now[0]} >= {threshold}; waiting ({waited:.0f}/{max_wait:.0f}s)")
        time.sleep(poll_seconds)
    return {
        "threshold": threshold,
        "load_at_start": first,
        "load_when_measuring": now,
        "waited_s": round(time.monotonic() - started),
        "quiet": now[0] < threshold,
    }
