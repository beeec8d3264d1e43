"""The router's view of the supervisor's state file: every version the supervisor
publishes is seen, whatever the file system's clock says, and a forged file is only
an empty one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slm_server.contracts.applied_registry import RegistryStamp, Retiring
from slm_server.contracts.records import BackendState, write_state
from slm_server.router.call import backend_state
from slm_server.router.call.backend_state import StateView


def published(state: str) -> BackendState:
    return BackendState(
        role="chat",
        model_id="m",
        backend="llamacpp",
        port=8501,
        state=state,
        pid=None,
        since=0.0,
        started_at=None,
        exit_status=None,
        restarts=0,
        reason=None,
        log_path="logs/x.log",
    )


@pytest.fixture(autouse=True)
def every_look_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backend_state, "STAT_EVERY_SECONDS", 0.0)


def test_a_same_size_version_within_one_clock_tick_is_seen(tmp_path: Path) -> None:
    path = tmp_path / "backends.state.json"
    write_state(path, os.getpid(), [published("ready")])
    view = StateView(path)
    first = view.get("chat", 8501)
    assert first is not None and first.state == "ready"
    before = path.stat()
    write_state(path, os.getpid(), [published("error")])  # "error" is as long as "ready"
    assert path.stat().st_size == before.st_size
    # The file system's clock has not moved on (a coarse tick, or a second).
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    later = view.get("chat", 8501)
    assert later is not None and later.state == "error"


@pytest.mark.parametrize(
    "text", ["[" * 100_000, '{"backends": [{"role": 1}]}', "{not json", '{"backends": 5}']
)
def test_a_forged_or_broken_file_is_an_empty_one(tmp_path: Path, text: str) -> None:
    path = tmp_path / "backends.state.json"
    write_state(path, os.getpid(), [published("ready")])
    view = StateView(path)
    assert view.get("chat", 8501) is not None
    path.write_text(text)
    assert view.get("chat", 8501) is None
    assert not view.launcher_alive()


def test_the_registry_stamp_and_the_retiring_backends_are_read_with_the_states(
    tmp_path: Path,
) -> None:
    path = tmp_path / "backends.state.json"
    write_state(path, os.getpid(), [published("ready")])
    view = StateView(path)
    assert view.stamp() is None
    assert view.retiring() == []
    stamp = RegistryStamp("0123456789abcdef", 2, 1700000000.5, "/etc/models.yaml")
    old = Retiring("chat", "m", 8501, 4242, "replaced", 1700000000.5, 1700000030.5)
    write_state(path, os.getpid(), [published("starting")], registry=stamp, retiring=[old])
    assert view.stamp() == stamp
    assert view.retiring() == [old]
    path.unlink()
    assert view.stamp() is None
    assert view.retiring() == []


def test_current_reads_the_file_that_get_reads_only_every_tick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(backend_state, "STAT_EVERY_SECONDS", 3600.0)
    path = tmp_path / "backends.state.json"
    write_state(path, os.getpid(), [published("restarting")])
    view = StateView(path)
    assert view.get("chat", 8501) == published("restarting")
    write_state(path, os.getpid(), [published("ready")])
    assert view.get("chat", 8501) == published("restarting")  # not looked at again yet
    monkeypatch.setattr(backend_state, "CURRENT_WITHIN_SECONDS", 3600.0)
    assert view.current("chat", 8501) == published("restarting")  # looked at just now
    monkeypatch.setattr(backend_state, "CURRENT_WITHIN_SECONDS", 0.0)
    assert view.current("chat", 8501) == published("ready")
    assert view.get("chat", 8501) == published("ready")
