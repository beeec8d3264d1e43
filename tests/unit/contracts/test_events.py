"""The watchdog's JSONL audit log."""

from __future__ import annotations

import datetime
import json
import logging
import re
import threading
from pathlib import Path
from typing import Any

import pytest

from slm_server.contracts.events import EVENTS, EventLog, utc_timestamp

# 2024-01-02T03:04:05Z
BASE = datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.UTC).timestamp()
TS = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.mark.parametrize(
    ("offset", "expected"),
    [
        (0.0, "2024-01-02T03:04:05.000Z"),
        (0.001, "2024-01-02T03:04:05.001Z"),
        (0.5, "2024-01-02T03:04:05.500Z"),
        (0.25, "2024-01-02T03:04:05.250Z"),
        (0.9995, "2024-01-02T03:04:05.999Z"),
        (60.0, "2024-01-02T03:05:05.000Z"),
    ],
)
def test_utc_timestamp(offset: float, expected: str) -> None:
    assert utc_timestamp(BASE + offset) == expected


def test_utc_timestamp_epoch() -> None:
    assert utc_timestamp(0.0) == "1970-01-01T00:00:00.000Z"


def test_utc_timestamp_ignores_the_local_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    monkeypatch.setenv("TZ", "Pacific/Kiritimati")
    time.tzset()
    try:
        assert utc_timestamp(BASE) == "2024-01-02T03:04:05.000Z"
    finally:
        monkeypatch.undo()
        time.tzset()


def test_emit_writes_one_line(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "watchdog.jsonl"
    log = EventLog(path, wall=lambda: BASE + 0.123)
    record = log.emit("backend_failure", role="standard", port=8501, reason="5xx", streak=1)
    assert record == {
        "ts": "2024-01-02T03:04:05.123Z",
        "event": "backend_failure",
        "role": "standard",
        "port": 8501,
        "reason": "5xx",
        "streak": 1,
    }
    text = path.read_text(encoding="utf-8")
    assert text.endswith("\n")
    assert text.count("\n") == 1
    assert list(json.loads(text)) == ["ts", "event", "role", "port", "reason", "streak"]
    assert lines(path) == [record]
    assert TS.match(record["ts"])


def test_emit_appends(tmp_path: Path) -> None:
    path = tmp_path / "watchdog.jsonl"
    times = iter([BASE, BASE + 1.5])
    log = EventLog(path, wall=lambda: next(times))
    log.emit("supervisor_started")
    log.emit("supervisor_stopped", reason="signal")
    assert lines(path) == [
        {"ts": "2024-01-02T03:04:05.000Z", "event": "supervisor_started"},
        {"ts": "2024-01-02T03:04:06.500Z", "event": "supervisor_stopped", "reason": "signal"},
    ]


def test_appends_to_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "watchdog.jsonl"
    path.write_text('{"ts":"old","event":"supervisor_started"}\n')
    EventLog(path, wall=lambda: BASE).emit("supervisor_stopped")
    assert [r["ts"] for r in lines(path)] == ["old", "2024-01-02T03:04:05.000Z"]


def test_none_fields_are_dropped(tmp_path: Path) -> None:
    path = tmp_path / "watchdog.jsonl"
    record = EventLog(path, wall=lambda: BASE).emit(
        "restart_requested", role="r", status=None, detail=None, streak=0, flag=False, text=""
    )
    assert record == {
        "ts": "2024-01-02T03:04:05.000Z",
        "event": "restart_requested",
        "role": "r",
        "streak": 0,
        "flag": False,
        "text": "",
    }
    assert lines(path) == [record]


def test_fields_that_json_cannot_encode_are_written_as_text(tmp_path: Path) -> None:
    path = tmp_path / "watchdog.jsonl"
    EventLog(path, wall=lambda: BASE).emit("model_path_missing", path=Path("/m/x.gguf"))
    assert lines(path)[0]["path"] == "/m/x.gguf"


def test_non_ascii_stays_on_one_line(tmp_path: Path) -> None:
    path = tmp_path / "watchdog.jsonl"
    EventLog(path, wall=lambda: BASE).emit("restart_failed", detail="line one\nline two ✓")
    assert len(path.read_text(encoding="utf-8").splitlines()) == 1
    assert lines(path)[0]["detail"] == "line one\nline two ✓"


@pytest.mark.parametrize("event", ["", "backend_failed", "BACKEND_FAILURE", "restart"])
def test_unknown_events_are_rejected(tmp_path: Path, event: str) -> None:
    path = tmp_path / "watchdog.jsonl"
    with pytest.raises(ValueError, match="unknown watchdog event"):
        EventLog(path, wall=lambda: BASE).emit(event, role="r")
    assert not path.exists()


@pytest.mark.parametrize("event", sorted(EVENTS))
def test_every_known_event_is_accepted(tmp_path: Path, event: str) -> None:
    path = tmp_path / "watchdog.jsonl"
    EventLog(path, wall=lambda: BASE).emit(event)
    assert lines(path) == [{"ts": "2024-01-02T03:04:05.000Z", "event": event}]


def test_the_wall_clock_is_read_per_event(tmp_path: Path) -> None:
    path = tmp_path / "watchdog.jsonl"
    now = [BASE]
    log = EventLog(path, wall=lambda: now[0])
    log.emit("supervisor_started")
    now[0] += 0.042
    log.emit("supervisor_stopped")
    assert [r["ts"] for r in lines(path)] == [
        "2024-01-02T03:04:05.000Z",
        "2024-01-02T03:04:05.042Z",
    ]


def test_default_wall_clock_is_now(tmp_path: Path) -> None:
    path = tmp_path / "watchdog.jsonl"
    before = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=1)
    record = EventLog(path).emit("supervisor_started")
    after = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=1)
    assert TS.match(record["ts"])
    moment = datetime.datetime.strptime(record["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(
        tzinfo=datetime.UTC
    )
    assert before <= moment <= after


def test_two_logs_on_one_file_interleave_whole_lines(tmp_path: Path) -> None:
    path = tmp_path / "watchdog.jsonl"
    router = EventLog(path, wall=lambda: BASE)
    supervisor = EventLog(path, wall=lambda: BASE)
    padding = "x" * 2000  # long lines make a torn write visible
    per_writer = 200
    start = threading.Barrier(2)

    def write(log: EventLog, who: str) -> None:
        start.wait()
        for i in range(per_writer):
            log.emit("backend_failure", role=who, streak=i, detail=padding)

    threads = [
        threading.Thread(target=write, args=(router, "router")),
        threading.Thread(target=write, args=(supervisor, "supervisor")),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    records = lines(path)
    assert len(records) == 2 * per_writer
    for who in ("router", "supervisor"):
        mine = [r["streak"] for r in records if r["role"] == who]
        assert mine == list(range(per_writer))
    assert all(r["detail"] == padding for r in records)


def test_sequential_writers_on_one_file(tmp_path: Path) -> None:
    path = tmp_path / "watchdog.jsonl"
    first = EventLog(path, wall=lambda: BASE)
    second = EventLog(path, wall=lambda: BASE)
    first.emit("restart_requested", role="a")
    second.emit("restart_started", role="a")
    first.emit("restart_succeeded", role="a")
    assert [r["event"] for r in lines(path)] == [
        "restart_requested",
        "restart_started",
        "restart_succeeded",
    ]


def test_unwritable_path_does_not_raise(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a directory")
    path = blocker / "logs" / "watchdog.jsonl"
    with caplog.at_level(logging.INFO, logger="slm_server.watchdog"):
        record = EventLog(path, wall=lambda: BASE).emit("backend_exited", role="r", pid=42)
    assert record == {
        "ts": "2024-01-02T03:04:05.000Z",
        "event": "backend_exited",
        "role": "r",
        "pid": 42,
    }
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "cannot append to" in errors[0].getMessage()
    assert str(path) in errors[0].getMessage()


def test_path_that_is_a_directory_does_not_raise(tmp_path: Path) -> None:
    path = tmp_path / "watchdog.jsonl"
    path.mkdir()
    EventLog(path, wall=lambda: BASE).emit("supervisor_started")
    assert path.is_dir()


def test_events_are_mirrored_to_the_logger(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "watchdog.jsonl"
    with caplog.at_level(logging.INFO, logger="slm_server.watchdog"):
        EventLog(path, wall=lambda: BASE).emit("backend_failure", role="r", port=8501, status=None)
    messages = [r.getMessage() for r in caplog.records if r.name == "slm_server.watchdog"]
    assert messages == ["watchdog: backend_failure role=r port=8501"]
