"""One launcher per log directory: a second ``backends`` on the same one refuses to
start and touches nothing of the first's; the lock goes with its holder, however it
ends. Real launchers, fake llama-servers."""

from __future__ import annotations

import signal
from pathlib import Path

from tests.integration.watched import fake_entry, watched
from tests.processes import pid_alive, poll, start_command


def test_a_second_launcher_on_the_same_log_directory_refuses_and_touches_nothing(
    tmp_path: Path,
) -> None:
    models = {"chat": fake_entry(tmp_path, "chat")}
    with watched(tmp_path, models, router=False) as stack:
        pid = stack.pid("chat")
        second = start_command("backends", stack.env, tmp_path / "second.out")
        try:
            assert second.popen.wait(timeout=30) == 1
        finally:
            second.stop()  # a launcher that did not refuse must not outlive the test
        said = second.text()
        assert f"another launcher (pid {stack.launcher.popen.pid})" in said, said
        [refused] = stack.events("supervisor_refused")
        assert refused["holder_pid"] == stack.launcher.popen.pid
        assert refused["pid"] == second.popen.pid
        # Nothing of the first's was stopped, swept or taken over.
        assert "leftover" not in said
        assert stack.pid("chat") == pid and pid_alive(pid)
        assert stack.state("chat")["state"] == "ready"
        assert stack.events("supervisor_started")[-1]["pid"] == stack.launcher.popen.pid
        assert [e["event"] for e in stack.events() if e["event"].startswith("backend_")] == []
        assert (stack.log_dir / "supervisor.sock").exists()


def test_the_lock_goes_with_a_killed_launcher(tmp_path: Path) -> None:
    models = {"chat": fake_entry(tmp_path, "chat")}
    with watched(tmp_path, models, router=False) as first:
        old = first.pid("chat")
        first.launcher.stop(signal.SIGKILL)
        poll(lambda: not pid_alive(old), 15, "the orphaned backend to die")
    with watched(tmp_path, models, router=False) as again:
        assert again.state("chat")["state"] == "ready"
        assert again.events("supervisor_refused") == []
