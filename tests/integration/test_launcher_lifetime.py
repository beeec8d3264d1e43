"""No backend outlives the launcher: on SIGTERM, and on SIGKILL (Linux parent-death
signal), and a leftover from an earlier run is swept at the next start."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import pytest

from tests.integration.real_stack import running_backends
from tests.processes import pid_alive, poll

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


def test_a_taken_port_is_reported_with_its_holder(tmp_path: Path) -> None:
    with running_backends(tmp_path, roles=("standard",)) as first:
        port = first.ports["standard"]
        assert httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200
        second_dir = tmp_path / "second"
        second_dir.mkdir()
        from tests.processes import start_command

        env = {**first.env, "SLM_BACKEND_LOG_DIR": str(second_dir / "logs")}
        second = start_command("backends", env, second_dir / "backends.out")
        assert second.popen.wait(timeout=30) == 1
        output = second.text()
        assert f"port {port} is in use by pid {first.pids()[0]}" in output
        assert "nothing could be started" in output
