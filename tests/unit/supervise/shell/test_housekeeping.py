"""The supervisor's file chores (:mod:`slm_server.supervise.shell.housekeeping`) in process, on
the fake process layer: leftovers of an earlier launcher, the router's request files,
log trimming, and a failed chore reported once per distinct error."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from slm_server.contracts.events import EventLog
from slm_server.contracts.records import PidRecord, write_pidfile
from slm_server.contracts.restart_requests import RestartRequest, write_request
from slm_server.supervise.shell.housekeeping import ChoreErrors, Housekeeping
from tests.unit.supervise.fakes import WALL, FakeControl, events, make, port, serving


def logged(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_a_failed_chore_is_reported_once_per_distinct_error(tmp_path: Path) -> None:
    log = tmp_path / "watchdog.jsonl"
    chores = ChoreErrors(EventLog(log))
    full = OSError(28, "No space left on device")
    chores.failed("state_write_failed", "/x", full)
    chores.failed("state_write_failed", "/x", full)  # the same again: quiet
    chores.failed("state_write_failed", "/y", full)  # another path: reported
    chores.failed("state_write_failed", "/x", PermissionError(13, "Permission denied"))
    chores.done("/x")
    chores.failed("state_write_failed", "/x", full)  # failing again after a success
    seen = [(e["path"], e["error"]) for e in logged(log)]
    assert seen == [
        ("/x", "OSError: [Errno 28] No space left on device"),
        ("/y", "OSError: [Errno 28] No space left on device"),
        ("/x", "PermissionError: [Errno 13] Permission denied"),
        ("/x", "OSError: [Errno 28] No space left on device"),
    ]


def housekeeping(tmp_path: Path, log_max_mb: str = "100") -> tuple[Housekeeping, FakeControl, Path]:
    supervisor, control = make(tmp_path, SLM_BACKEND_LOG_MAX_MB=log_max_mb)
    return supervisor.housekeeping, control, supervisor.settings.watchdog.log_path


def test_leftovers_are_stopped_only_while_their_pidfile_record_matches(tmp_path: Path) -> None:
    chores, control, _log = housekeeping(tmp_path)
    records = [
        PidRecord(71, 1071.0, port(0), "a", "m-a", ["llama-server"]),
        PidRecord(72, 1072.0, port(1), "b", "m-b", ["llama-server"]),
    ]
    write_pidfile(chores.settings.pidfile_path, 1, records)
    control.leftovers = {72}  # 71 is gone (or another process by now)
    assert chores.sweep_leftovers() == records
    assert control.leftovers_stopped == [(72, 1072.0)]


def test_requests_are_taken_and_an_unreadable_directory_reported_once(tmp_path: Path) -> None:
    chores, _control, log = housekeeping(tmp_path)
    request = RestartRequest("a", "m-a", port(0), "5xx", WALL, "2 consecutive 5xx")
    write_request(chores.watchdog.request_dir, request)
    assert chores.take_requests() == [request]
    assert chores.take_requests() == []  # each file is taken once
    directory = chores.watchdog.request_dir
    for child in directory.iterdir():
        child.unlink()
    directory.rmdir()
    directory.symlink_to(directory)  # a loop: listing it fails
    assert chores.take_requests() == []
    assert chores.take_requests() == []
    [failed] = [e for e in logged(log) if e["event"] == "request_sweep_failed"]
    assert failed["path"] == str(directory)


def test_logs_past_the_limit_are_trimmed_and_reported(tmp_path: Path) -> None:
    supervisor, control = make(tmp_path)

    async def scenario() -> None:
        await serving(supervisor)
        backend = supervisor.backends["a"]
        assert backend.plan is not None
        control.trimmed[backend.plan.log_path] = 4096
        supervisor.housekeeping.trim_logs(supervisor.backends.values())
        await supervisor.stop_all()

    asyncio.run(scenario())
    [trimmed] = events(supervisor, "backend_log_trimmed")
    plan = control.plans[0]
    assert trimmed == {
        "ts": trimmed["ts"],
        "event": "backend_log_trimmed",
        "role": "a",
        "model_id": "m-a",
        "port": port(0),
        "path": str(plan.log_path),
        "bytes": 4096,
    }


def test_no_trimming_without_a_limit(tmp_path: Path) -> None:
    chores, control, _log = housekeeping(tmp_path, log_max_mb="0")
    control.trim_error = OSError(5, "trimmed anyway")  # would be reported if it were called
    chores.trim_logs([])
    assert events_named(chores, "backend_log_trim_failed") == []


def events_named(chores: Housekeeping, name: str) -> list[dict[str, Any]]:
    path = chores.watchdog.log_path
    return [e for e in logged(path) if e["event"] == name] if path.exists() else []
