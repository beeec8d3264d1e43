"""No backend outlives the launcher: on SIGTERM, and on SIGKILL (Linux parent-death
signal), and a leftover from an earlier run is swept at the next start."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.real_stack import example_registry, llama_server_bin, running_backends
from tests.processes import ROOT, free_port, http_ok, pid_alive, poll, start_command

pytestmark = pytest.mark.real_model


def test_sigterm_stops_every_backend(tmp_path: Path) -> None:
    with running_backends(tmp_path, roles=("standard", "embeddings")) as stack:
        pids = stack.pids()
        assert len(pids) == 2 and all(pid_alive(p) for p in pids)
        assert stack.launcher.stop(signal.SIGTERM) == 0
        poll(lambda: not any(pid_alive(p) for p in pids), 15, "backends to exit")
    states = {b["role"]: b["state"] for b in stack.state()}
    assert states == {"standard": "stopped", "embeddings": "stopped"}


def test_sigkill_of_the_launcher_takes_its_backends_down(tmp_path: Path) -> None:
    with running_backends(tmp_path, roles=("standard",)) as stack:
        [pid] = stack.pids()
        stack.launcher.stop(signal.SIGKILL)
        poll(lambda: not pid_alive(pid), 15, "the orphaned backend to die")


def watchdog_events(log_dir: Path) -> list[dict[str, Any]]:
    path = log_dir / "watchdog.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_foreign_process_on_the_port_is_named_and_never_killed(tmp_path: Path) -> None:
    data = yaml.safe_load((ROOT / "config" / "models.yaml.example").read_text())
    port = free_port()
    registry = example_registry({role: port for role in data["models"]}, roles=("standard",))
    config = tmp_path / "models.yaml"
    config.write_text(yaml.safe_dump(registry, sort_keys=False))
    foreign = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        poll(lambda: http_ok(f"http://127.0.0.1:{port}/"), 10, "the foreign server")
        env = {
            "SLM_CONFIG": str(config),
            "SLM_BACKEND_LOG_DIR": str(tmp_path / "logs"),
            "SLM_LLAMA_SERVER_BIN": llama_server_bin(),
            "SLM_ENV_FILE": str(tmp_path / "no.env"),
            "SLM_WATCHDOG_RESTART_COOLDOWN_SECONDS": "0",
        }
        launcher = start_command("backends", env, tmp_path / "backends.out")
        assert launcher.popen.wait(timeout=60) == 1
        assert f"port {port} is in use by pid {foreign.pid}" in launcher.text()
        events = watchdog_events(tmp_path / "logs")
        refused = [e for e in events if e["event"] == "stray_kill_refused"]
        assert refused
        assert all(e["pid"] == foreign.pid for e in refused)
        assert "port_stray_killed" not in {e["event"] for e in events}
        assert events[-2]["event"] == "backend_abandoned"
        assert foreign.poll() is None, "a process we did not start must never be killed"
    finally:
        foreign.kill()
        foreign.wait()


def test_a_leftover_of_ours_on_the_port_is_killed(tmp_path: Path) -> None:
    with running_backends(tmp_path, roles=("standard",)) as first:
        [old_pid] = first.pids()
        # The first launcher frozen, as a hung one would be: running, it would restart
        # its backend once the second had killed it, and the two would take turns.
        first.launcher.popen.send_signal(signal.SIGSTOP)
        second_dir = tmp_path / "second"
        env = {**first.env, "SLM_BACKEND_LOG_DIR": str(second_dir / "logs")}
        second = start_command("backends", env, tmp_path / "second.out")
        try:
            poll(
                lambda: any(
                    e["event"] == "port_stray_killed" for e in watchdog_events(second_dir / "logs")
                ),
                30,
                "port_stray_killed",
            )
            [killed] = [
                e for e in watchdog_events(second_dir / "logs") if e["event"] == "port_stray_killed"
            ]
            assert killed["pid"] == old_pid
            poll(lambda: not pid_alive(old_pid), 10, "the stray to die")
            port = first.ports["standard"]
            poll(lambda: http_ok(f"http://127.0.0.1:{port}/health"), 60, "the new backend")
        finally:
            assert second.stop() == 0
            first.launcher.popen.send_signal(signal.SIGCONT)
