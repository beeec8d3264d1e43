"""Publishing the state file and the pidfile (:mod:`slm_server.supervise.shell.publish`) in
process, on the fake process layer: written only when something changed, the pidfile
holding only live processes, a failed write reported and retried."""

from __future__ import annotations

import asyncio
from pathlib import Path

from slm_server.contracts.records import read_pidfile, read_state
from slm_server.supervise.shell.publish import snapshot
from tests.unit.supervise.fakes import WALL, events, make, serving, until


def test_nothing_is_written_until_something_changed(tmp_path: Path) -> None:
    supervisor, _control = make(tmp_path)
    publisher = supervisor.publisher
    publisher.dirty = False
    supervisor.publish()
    assert not supervisor.settings.state_path.exists()
    publisher.dirty = True
    supervisor.publish()
    assert supervisor.settings.state_path.exists()
    assert not publisher.dirty


def test_the_pidfile_holds_only_the_live_processes(tmp_path: Path) -> None:
    supervisor, control = make(tmp_path, ("a", "b"))

    async def scenario() -> None:
        await serving(supervisor)
        supervisor.dirty = True
        supervisor.publish()
        assert [r.role for r in read_pidfile(supervisor.settings.pidfile_path)] == ["a", "b"]
        control.child("b").status = 0  # ended; not yet seen by a turn
        supervisor.dirty = True
        supervisor.publish()
        [record] = read_pidfile(supervisor.settings.pidfile_path)
        assert (record.pid, record.argv) == (control.child("a").pid, list(control.plans[0].argv))
        await supervisor.stop_all()

    asyncio.run(scenario())


def test_a_failed_write_is_reported_and_retried(tmp_path: Path) -> None:
    supervisor, _control = make(tmp_path)
    path = supervisor.settings.state_path
    path.mkdir(parents=True)  # a directory where the file goes: every write fails
    supervisor.publish()
    supervisor.publish()
    assert supervisor.dirty
    path.rmdir()
    supervisor.publish()
    assert not supervisor.dirty
    failed = events(supervisor, "state_write_failed")
    assert failed and {e["path"] for e in failed} == {str(path)}
    assert read_state(path)[1] == []


def test_a_snapshot_before_any_launch_and_while_serving(tmp_path: Path) -> None:
    supervisor, control = make(tmp_path)

    async def scenario() -> None:
        supervisor.start()
        backend = supervisor.backends["a"]
        before = snapshot(backend, "/logs", 100.0, WALL)
        assert (before.state, before.pid, before.log_path, before.health_path) == (
            "starting",
            None,
            "/logs",
            "/health",
        )
        await until(supervisor, lambda: backend.life.state.value == "ready", "ready")
        serving_now = snapshot(backend, "/logs", 100.0, WALL)
        assert (serving_now.state, serving_now.pid) == ("ready", control.child("a").pid)
        assert serving_now.log_path == str(control.plans[0].log_path)
        await supervisor.stop_all()
        stopped = snapshot(backend, "/logs", 100.0, WALL)
        assert (stopped.state, stopped.pid, stopped.started_at) == ("stopped", None, None)

    asyncio.run(scenario())
