"""Killing a wedged backend: its whole process group goes at once, SIGSTOP or not."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from slm_server.launch import process
from slm_server.launch.plan import LaunchPlan

# A parent that ignores SIGTERM and forks a child into its group, then hangs.
HANGS = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(child.pid, flush=True)
time.sleep(600)
"""


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_stopped_backend_and_its_children_are_killed_at_once(tmp_path: Path) -> None:
    log = tmp_path / "backend.log"
    plan = LaunchPlan(
        role="standard",
        model_id="m",
        backend="llamacpp",
        model_type="lm",
        host="127.0.0.1",
        port=1,
        argv=(sys.executable, "-c", HANGS),
        log_path=log,
        base_url="http://127.0.0.1:1",
    )
    proc = process.spawn(plan, dict(os.environ), time.monotonic)
    wait_for(lambda: log.read_text().strip().isdigit())
    child = int(log.read_text())
    os.killpg(proc.pid, signal.SIGSTOP)  # wedged: SIGTERM would never be acted on
    wait_for(lambda: psutil.Process(proc.pid).status() == psutil.STATUS_STOPPED)
    started = time.monotonic()
    status = process.kill(proc)
    assert time.monotonic() - started < 2.0
    assert status == -signal.SIGKILL
    assert not proc.alive()
    wait_for(lambda: not psutil.pid_exists(child) or psutil.Process(child).status() == "zombie")
