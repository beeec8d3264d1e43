"""The pidfile sweep: a leftover backend of an earlier launcher is stopped at the next
start only when its pid *and* create time match the record. A missing model path is
never waited on: every launch fails at once and the restart budget abandons it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import yaml

from tests.processes import free_port, pid_alive, poll, start_command
from tests.registry_entries import registry_entry


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A stand-in for a backend left running by a launcher that was SIGKILLed."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True
    )
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def write_pidfile(log_dir: Path, pid: int, create_time: float) -> None:
    log_dir.mkdir(parents=True, exist_ok=True)
    record = {
        "pid": pid,
        "create_time": create_time,
        "port": 1,
        "role": "old",
        "model_id": "old-model",
        "argv": ["llama-server"],
    }
    (log_dir / "backends.pids.json").write_text(
        json.dumps({"launcher_pid": 1, "processes": [record]})
    )


def run_launcher(tmp_path: Path) -> tuple[int, str]:
    """Run ``backends`` on a registry whose only model file is missing."""
    config = tmp_path / "models.yaml"
    entry = registry_entry(
        "absent", free_port(), model_path=str(tmp_path / "absent.gguf"), default_timeout=5
    )
    config.write_text(yaml.safe_dump({"models": {"standard": entry}}))
    env = {
        "SLM_CONFIG": str(config),
        "SLM_BACKEND_LOG_DIR": str(tmp_path / "logs"),
        "SLM_LLAMA_SERVER_BIN": "/bin/true",
        "SLM_STOP_TIMEOUT_SECONDS": "2",
        "SLM_WATCHDOG_RESTART_COOLDOWN_SECONDS": "0",
    }
    started = time.monotonic()
    launcher = start_command("backends", env, tmp_path / "backends.out")
    status = launcher.popen.wait(timeout=30)
    assert time.monotonic() - started < 20, "a missing model path must not be waited on"
    return status, launcher.text()


def test_leftover_with_matching_create_time_is_stopped(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    write_pidfile(tmp_path / "logs", sleeper.pid, psutil.Process(sleeper.pid).create_time())
    status, output = run_launcher(tmp_path)
    poll(lambda: sleeper.poll() is not None, 10, "the leftover to be stopped")
    assert "stopped leftover backend old-model" in output
    assert status == 1
    assert "absent.gguf does not exist" in output
    log_lines = (tmp_path / "logs" / "watchdog.jsonl").read_text().splitlines()
    events = [json.loads(line)["event"] for line in log_lines]
    assert events.count("model_path_missing") == 6, "the first launch and five restarts"
    assert events[-2:] == ["backend_abandoned", "supervisor_stopped"]


def test_a_reused_pid_is_never_killed(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    real = psutil.Process(sleeper.pid).create_time()
    write_pidfile(tmp_path / "logs", sleeper.pid, real - 1000)
    status, output = run_launcher(tmp_path)
    assert status == 1
    assert pid_alive(sleeper.pid)
    assert "leftover" not in output
