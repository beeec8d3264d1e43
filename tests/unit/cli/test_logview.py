"""``slm_server.cli.logview``: the readable watchdog timeline, start.out colouring, time
parsing and inheritance, the ``all`` merge, and the file handling behind ``logs``."""

from __future__ import annotations

import datetime
import io
import json
import os
import re
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from slm_server.cli import logview
from slm_server.cli.logview import (
    LogFile,
    format_event,
    format_server_line,
    format_watchdog_line,
    parse_time,
    render,
    use_colour,
)
from slm_server.contracts.events import EVENTS

ANSI = re.compile(r"\x1b\[[0-9;]*m")
BACKEND: dict[str, Any] = {"role": "reasoning", "model_id": "unsloth/qwen3", "port": 8502}
NAMED = "reasoning (unsloth/qwen3) :8502"

TUNABLES: dict[str, Any] = {
    "enabled": True,
    "failure_threshold": 2,
    "stall_seconds": 300.0,
    "sweep_seconds": 5.0,
    "max_restarts": 5,
    "restart_window_seconds": 600.0,
    "restart_cooldown_seconds": 10.0,
    "startup_grace_seconds": 180.0,
    "request_dir": "/srv/slm/logs/watchdog-requests",
    "log_path": "/srv/slm/logs/watchdog.jsonl",
    "backend_log_max_mb": 100.0,
}

# One realistic record per event (fields as the router and supervisor emit them), and
# the line it must render as.
SAMPLES: dict[str, tuple[dict[str, Any], str]] = {
    "backend_failure": (
        {**BACKEND, "reason": "5xx", "status": 500, "streak": 1, "detail": "HTTP 500: oom"},
        f'{NAMED}  reason=5xx status=500 streak=1 detail="HTTP 500: oom"',
    ),
    "unclassified_status": (
        {**BACKEND, "status": 418},
        f"{NAMED}  status=418",
    ),
    "restart_requested": (
        {**BACKEND, "reason": "stall", "streak": 2, "file": "8502-reasoning-17.json"},
        f"{NAMED}  reason=stall streak=2 file=8502-reasoning-17.json",
    ),
    "request_retried": (
        {**BACKEND, "request_id": "r1", "reason": "bad_backend_response", "waited_seconds": 1.25},
        f"{NAMED}  request_id=r1 reason=bad_backend_response waited=1.25s",
    ),
    "stale_request_discarded": (
        {
            **BACKEND,
            "requested_reason": "stall",
            "requested_at": 1796030042.117,
            "started_at": 1796030050.5,
            "grace_seconds": 180.0,
            "state": "starting",
        },
        f"{NAMED}  requested_reason=stall requested_at=09:14:02.117 "
        "started_at=09:14:10.500 grace=180s state=starting",
    ),
    "backend_exited": (
        {**BACKEND, "pid": 35559, "signal": "SIGKILL", "state": "ready"},
        f"{NAMED}  pid=35559 signal=SIGKILL state=ready",
    ),
    "backend_not_running": (
        {**BACKEND, "state": "failed", "requested_reason": "timeout"},
        f"{NAMED}  state=failed requested_reason=timeout",
    ),
    "restart_started": (
        {**BACKEND, "reason": "stall", "old_pid": 35559, "attempt": 1},
        f"{NAMED}  reason=stall old_pid=35559 attempt=1",
    ),
    "restart_succeeded": (
        {**BACKEND, "reason": "stall", "old_pid": 35559, "new_pid": 41220, "attempt": 1},
        f"{NAMED}  reason=stall old_pid=35559 new_pid=41220 attempt=1",
    ),
    "restart_failed": (
        {**BACKEND, "reason": "exited with code 1 while starting", "attempt": 2},
        f'{NAMED}  reason="exited with code 1 while starting" attempt=2',
    ),
    "port_stray_killed": (
        {**BACKEND, "pid": 30001, "command": "llama-server --port 8502", "freed": True},
        f'{NAMED}  pid=30001 command="llama-server --port 8502" freed=true',
    ),
    "stray_kill_refused": (
        {**BACKEND, "pid": 30002, "command": "nginx", "reason": "not ours"},
        f'{NAMED}  pid=30002 command=nginx reason="not ours"',
    ),
    "model_path_missing": (
        {**BACKEND, "field": "path", "reason": "models/qwen3.gguf: no such file"},
        f'{NAMED}  field=path reason="models/qwen3.gguf: no such file"',
    ),
    "backend_abandoned": (
        {**BACKEND, "reason": "5 restarts within 600s; last reason: stall"},
        f'{NAMED}  reason="5 restarts within 600s; last reason: stall"',
    ),
    "process_unkillable": (
        {**BACKEND, "pid": 35559, "reason": "still alive after SIGKILL"},
        f'{NAMED}  pid=35559 reason="still alive after SIGKILL"',
    ),
    "restart_confirmed": (
        {**BACKEND, "reason": "5xx", "rule": "canary_failed", "evidence": {"canary": "500"}},
        f'{NAMED}  reason=5xx rule=canary_failed evidence={{"canary":"500"}}',
    ),
    "restart_not_confirmed": (
        {**BACKEND, "reason": "5xx", "rule": "canary_ok", "why": "the canary answered 200"},
        f'{NAMED}  reason=5xx rule=canary_ok why="the canary answered 200"',
    ),
    "deadline_not_counted": (
        {
            **BACKEND,
            "delivered": False,
            "silent_seconds": 0.4,
            "needed_seconds": 60.0,
            "stall_seconds": 300.0,
        },
        f"{NAMED}  delivered=false silent=0.4s needed=60s stall=300s",
    ),
    "backend_log_trim_failed": (
        {**BACKEND, "path": "/srv/slm/logs/r.log", "error": "OSError: [Errno 28] No space"},
        f'{NAMED}  path=/srv/slm/logs/r.log error="OSError: [Errno 28] No space"',
    ),
    "state_write_failed": (
        {"path": "/srv/slm/logs/backends.state.json", "error": "OSError: full"},
        'path=/srv/slm/logs/backends.state.json error="OSError: full"',
    ),
    "request_sweep_failed": (
        {"path": "/srv/slm/logs/watchdog-requests", "error": "PermissionError: denied"},
        'path=/srv/slm/logs/watchdog-requests error="PermissionError: denied"',
    ),
    "backend_log_trimmed": (
        {**BACKEND, "path": "/srv/slm/logs/reasoning.log", "bytes": 104857600},
        f"{NAMED}  path=/srv/slm/logs/reasoning.log bytes=104857600",
    ),
    "supervisor_started": (
        {
            "pid": 35550,
            "config": "/srv/slm/config/models.yaml",
            "models": ["unsloth/qwen3", "smollm2-135m-instruct"],
            **TUNABLES,
            "stop_timeout_seconds": 10.0,
            "ready_timeout_seconds": 600.0,
        },
        "supervisor  pid=35550 config=/srv/slm/config/models.yaml "
        'models=["unsloth/qwen3","smollm2-135m-instruct"] enabled=true failure_threshold=2 '
        "stall=300s sweep=5s max_restarts=5 restart_window=600s restart_cooldown=10s "
        "startup_grace=180s request_dir=/srv/slm/logs/watchdog-requests "
        "log_path=/srv/slm/logs/watchdog.jsonl backend_log_max=100MB stop_timeout=10s "
        "ready_timeout=600s",
    ),
    "supervisor_stopped": ({"pid": 35550, "exit_status": 0}, "supervisor  pid=35550 exit_status=0"),
    "supervisor_refused": (
        {"pid": 35611, "holder_pid": 35550, "path": "/srv/slm/logs/launcher.lock"},
        "supervisor  pid=35611 holder_pid=35550 path=/srv/slm/logs/launcher.lock",
    ),
    "backend_loading": ({**BACKEND}, NAMED),
    "backend_loaded": (
        {**BACKEND, "pid": 41220, "seconds": 1.25, "memory_measured_mb": 812},
        f"{NAMED}  pid=41220 seconds=1.25 memory_measured=812MB",
    ),
    "backend_unloaded": (
        {**BACKEND, "pid": 41220, "reason": "evicted", "for_model": "qwen3-coder", "seconds": 0.4},
        f"{NAMED}  pid=41220 reason=evicted for_model=qwen3-coder seconds=0.4",
    ),
    "cache_saved": (
        {**BACKEND, "slots": 2, "tokens": 6053, "bytes": 139000000, "ms": 41.2},
        f"{NAMED}  slots=2 tokens=6053 bytes=139000000 ms=41.2",
    ),
    "cache_save_failed": (
        {**BACKEND, "slot": 1, "reason": "no answer within 30s"},
        f'{NAMED}  slot=1 reason="no answer within 30s"',
    ),
    "cache_restored": (
        {**BACKEND, "slots": 1, "tokens": 6053, "bytes": 139000000, "ms": 33.0},
        f"{NAMED}  slots=1 tokens=6053 bytes=139000000 ms=33",
    ),
    "cache_rejected": (
        {**BACKEND, "reason": "a.slot0.bin has 12 bytes, not 139000000"},
        f'{NAMED}  reason="a.slot0.bin has 12 bytes, not 139000000"',
    ),
    "memory_grew": (
        {**BACKEND, "resident_mb": 1340, "admitted_mb": 1200, "prompt_cache_mb": 1000},
        f"{NAMED}  resident=1340MB admitted=1200MB prompt_cache=1000MB",
    ),
    "load_failed": (
        {**BACKEND, "reason": "exited with status 1 while loading"},
        f'{NAMED}  reason="exited with status 1 while loading"',
    ),
    "memory_pressure": (
        {
            "state": "entered",
            "free_mb": 812,
            "floor_mb": 1024,
            "resume_mb": 1280,
            "source": "meminfo",
            "holders": [
                {
                    "role": "chat",
                    "model_id": "qwen3",
                    "memory_mb": 5120,
                    "load": "always",
                    "busy": False,
                }
            ],
        },
        "state=entered free=812MB floor=1024MB resume=1280MB source=meminfo"
        ' holders=[{"role":"chat","model_id":"qwen3","memory_mb":5120,"load":"always",'
        '"busy":false}]',
    ),
    "evicted_for_pressure": (
        {**BACKEND, "memory_mb": 2048, "free_mb": 812, "floor_mb": 1024},
        f"{NAMED}  memory=2048MB free=812MB floor=1024MB",
    ),
    "remote_ejected": (
        {
            "role": "gpu-box",
            "model_id": "qwen3",
            "url": "http://10.0.0.5:8080/v1",
            "reason": "5xx: a one-token canary answered 503",
            "rule": "canary_5xx",
            "seconds": 30.0,
            "ejections": 1,
            "evidence": {"models": {"reply": "ok", "status": 200}},
        },
        'gpu-box (qwen3)  url=http://10.0.0.5:8080/v1 reason="5xx: a one-token canary answered'
        ' 503" rule=canary_5xx seconds=30 ejections=1'
        ' evidence={"models":{"reply":"ok","status":200}}',
    ),
    "remote_readmitted": (
        {
            "role": "gpu-box",
            "model_id": "qwen3",
            "url": "http://10.0.0.5:8080/v1",
            "rule": "canary_ok",
            "why": "a one-token canary answered 200",
            "ejections": 1,
        },
        "gpu-box (qwen3)  url=http://10.0.0.5:8080/v1 rule=canary_ok"
        ' why="a one-token canary answered 200" ejections=1',
    ),
    "config_reload_requested": (
        {"source": "signal", "config": "/srv/slm/config/models.yaml"},
        "supervisor  source=signal config=/srv/slm/config/models.yaml",
    ),
    "config_reloaded": (
        {
            "source": "command",
            "config": "/srv/slm/config/models.yaml",
            "version": "3f2a9c0d1e4b5a67",
            "generation": 2,
            "added": ["coder"],
            "removed": [],
            "replaced": ["reasoning"],
            "unchanged": ["embed"],
            "seconds": 0.042,
        },
        "supervisor  source=command config=/srv/slm/config/models.yaml version=3f2a9c0d1e4b5a67"
        ' generation=2 added=["coder"] removed=[] replaced=["reasoning"] unchanged=["embed"]'
        " seconds=0.042",
    ),
    "config_reload_refused": (
        {
            "source": "file",
            "config": "/srv/slm/config/models.yaml",
            "refused": "invalid",
            "problems": ["models.yaml: 'coder' (id 'q'): port: is also used by 'embed'"],
        },
        "supervisor  source=file config=/srv/slm/config/models.yaml refused=invalid"
        " problems=[\"models.yaml: 'coder' (id 'q'): port: is also used by 'embed'\"]",
    ),
    "backend_retiring": (
        {**BACKEND, "pid": 41220, "reason": "replaced", "deadline_seconds": 30.0},
        f"{NAMED}  pid=41220 reason=replaced deadline=30s",
    ),
    "backend_retired": (
        {**BACKEND, "pid": 41220, "reason": "replaced", "ended": "drained", "seconds": 1.5},
        f"{NAMED}  pid=41220 reason=replaced ended=drained seconds=1.5",
    ),
}

WIDTH = max(len(name) for name in EVENTS)


def record(event: str, ts: str = "2026-11-30T09:14:02.117Z", **fields: Any) -> dict[str, Any]:
    return {"ts": ts, "event": event, **fields}


def test_every_event_has_a_sample() -> None:
    assert set(SAMPLES) == EVENTS


@pytest.mark.parametrize("event", sorted(EVENTS))
def test_format_event_renders_each_event_as_one_timeline_line(event: str) -> None:
    fields, expected = SAMPLES[event]
    line = format_event(record(event, **fields))
    assert line == f"2026-11-30 09:14:02.117  {event.ljust(WIDTH)}  {expected}"
    assert "\n" not in line
    assert "\x1b" not in line


def test_format_event_matches_the_documented_example() -> None:
    line = format_event(
        record(
            "restart_succeeded", **BACKEND, reason="stall", old_pid=35559, new_pid=41220, attempt=1
        )
    )
    assert re.fullmatch(
        r"2026-11-30 09:14:02\.117  restart_succeeded +reasoning \(unsloth/qwen3\) :8502  "
        r"reason=stall old_pid=35559 new_pid=41220 attempt=1",
        line,
    )


def test_format_event_without_a_backend_lists_the_fields_right_after_the_name() -> None:
    line = format_event(record("stale_request_discarded", file="x.json", reason="unreadable"))
    assert line.endswith("stale_request_discarded  file=x.json reason=unreadable")


def test_format_event_values() -> None:
    line = format_event(
        record(
            "backend_failure",
            role="chat",
            detail='line one\nsaid "no"',
            empty="",
            nested={"a": [1, 2]},
            missing=None,
            ratio=0.25,
            exit_code=-9,
        )
    )
    assert 'detail="line one\\nsaid \\"no\\""' in line
    assert 'empty=""' in line
    assert 'nested={"a":[1,2]}' in line
    assert "missing=null ratio=0.25 exit_code=-9" in line
    assert "  chat  " in line


def test_format_event_converts_other_offsets_to_utc_and_keeps_an_unparsable_ts() -> None:
    shifted = format_event(record("supervisor_stopped", ts="2026-11-30T10:14:02.117+01:00"))
    assert shifted.startswith("2026-11-30 09:14:02.117  supervisor_stopped")
    odd = format_event({"ts": "yesterday", "event": "supervisor_stopped", "pid": 1})
    assert odd.startswith("yesterday ")
    assert odd.endswith("supervisor  pid=1")


def test_format_event_with_colour_paints_the_event_by_severity() -> None:
    failed = format_event(record("restart_failed", **BACKEND, attempt=1), colour=True)
    assert logview.RED + "restart_failed" in failed
    ok = format_event(record("restart_succeeded", **BACKEND), colour=True)
    assert logview.GREEN + "restart_succeeded" in ok
    requested = format_event(record("restart_requested", **BACKEND), colour=True)
    assert logview.YELLOW + "restart_requested" in requested
    assert ANSI.sub("", failed) == format_event(record("restart_failed", **BACKEND, attempt=1))


@pytest.mark.parametrize("line", ["not json", "[1, 2]", '{"ts": "2026-11-30T09:14:02Z"}', "{"])
def test_malformed_watchdog_lines_are_shown_not_fatal(line: str) -> None:
    assert format_watchdog_line(line + "\n") == f"? {line}"


def test_blank_watchdog_lines_are_skipped() -> None:
    assert format_watchdog_line("   \n") is None


SERVER_LINES = {
    "error": "2026-11-30T09:14:03.000Z [backends] ERROR reasoning exited with code 1",
    "warning": "2026-11-30T09:14:01.500Z [router] WARNING upstream reasoning answered 500",
    "watchdog": "2026-11-30T09:14:02.118Z [backends] INFO watchdog: restart_started role=x",
    "start": "[start] ready: http://127.0.0.1:8000/v1 (OpenAI-compatible)",
    "plain": "2026-11-30T09:14:00.010Z [router] INFO routing 3 model(s)",
}


def test_format_server_line_without_colour_only_strips_trailing_whitespace() -> None:
    for line in SERVER_LINES.values():
        assert format_server_line(line + "  \r\n") == line
        assert format_server_line(line + "\n", colour=False) == line


@pytest.mark.parametrize(
    ("kind", "code"),
    [
        ("error", logview.RED),
        ("warning", logview.YELLOW),
        ("watchdog", logview.CYAN),
        ("start", logview.BOLD),
    ],
)
def test_format_server_line_colours(kind: str, code: str) -> None:
    line = SERVER_LINES[kind]
    assert format_server_line(line + "\n", colour=True) == f"{code}{line}{logview.RESET}"


def test_format_server_line_leaves_ordinary_lines_uncoloured() -> None:
    assert format_server_line(SERVER_LINES["plain"], colour=True) == SERVER_LINES["plain"]


class FakeTTY(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_use_colour_needs_a_terminal_and_no_no_color() -> None:
    assert use_colour(FakeTTY(True), {})
    assert not use_colour(FakeTTY(False), {})
    assert not use_colour(FakeTTY(True), {"NO_COLOR": "1"})


UTC = datetime.UTC


def test_parse_time_of_records_and_lines() -> None:
    expected = datetime.datetime(2026, 11, 30, 9, 14, 2, 117000, tzinfo=UTC)
    assert parse_time(record("supervisor_stopped")) == expected
    assert parse_time("2026-11-30T09:14:02.117Z [router] INFO x") == expected
    assert parse_time("2026-11-30T10:14:02.117+01:00 [router] INFO x") == expected
    naive = parse_time("2026-11-30T09:14:02.117 something")
    assert naive == expected


def test_lines_without_a_timestamp_inherit_the_previous_one() -> None:
    before = datetime.datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
    assert parse_time("[start] 2026-11-30 10:14:00 starting", before) == before
    assert parse_time("Traceback (most recent call last):", before) == before
    assert parse_time("  File 'x.py', line 3", None) is None
    assert parse_time({"event": "x"}, before) == before
    assert parse_time({"ts": "garbage", "event": "x"}, before) == before
    assert parse_time("2026-11-30T99:99:99Z oops", before) == before


START_OUT = """\
[start] 2026-11-30 10:13:58 starting slm_server in /srv/slm
[setup] uv found
2026-11-30T09:14:00.010Z [backends] INFO starting reasoning (unsloth/qwen3) on port 8502
2026-11-30T09:14:01.500Z [router] WARNING upstream reasoning answered 500
2026-11-30T09:14:02.117Z [backends] INFO watchdog: restart_started role=reasoning
Traceback (most recent call last):
2026-11-30T09:14:03.000Z [backends] ERROR reasoning exited with code 1
"""


def jsonl(*records: dict[str, Any]) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


WATCHDOG = (
    jsonl(
        record("supervisor_started", ts="2026-11-30T09:13:59.000Z", pid=35550),
        record("backend_failure", ts="2026-11-30T09:14:01.600Z", **BACKEND, reason="5xx"),
        record("restart_started", ts="2026-11-30T09:14:02.117Z", **BACKEND, attempt=1),
    )
    + "this is not json\n"
    + jsonl(
        record("supervisor_stopped", ts="2026-11-30T09:14:05.000Z", pid=35550, exit_status=0),
    )
)


@pytest.fixture
def logs(tmp_path: Path) -> Path:
    (tmp_path / "start.out").write_text(START_OUT)
    (tmp_path / "watchdog.jsonl").write_text(WATCHDOG)
    return tmp_path


def event_name(line: str) -> str:
    """The event name of a rendered watchdog line (``?`` for a malformed one)."""
    text = line.removeprefix(logview.WATCHDOG_MARK)
    return "?" if text.startswith("? ") else text.split()[2]


def run(mode: str, log_dir: Path, colour: bool = False) -> tuple[int, list[str]]:
    out = io.StringIO()
    status = render(mode, log_dir, log_dir / "watchdog.jsonl", False, colour, out)
    return status, out.getvalue().splitlines()


def test_render_server(logs: Path) -> None:
    status, lines = run("server", logs)
    assert status == 0
    assert lines == START_OUT.splitlines()


def test_render_server_with_colour(logs: Path) -> None:
    _status, lines = run("server", logs, colour=True)
    assert lines[0].startswith(logview.BOLD + "[start]")
    assert lines[-1].startswith(logview.RED)
    assert [ANSI.sub("", line) for line in lines] == START_OUT.splitlines()


def test_render_watchdog_is_a_timeline_with_malformed_lines_marked(logs: Path) -> None:
    status, lines = run("watchdog", logs)
    assert status == 0
    assert [event_name(line) for line in lines] == [
        "supervisor_started",
        "backend_failure",
        "restart_started",
        "?",
        "supervisor_stopped",
    ]
    assert lines[3] == "? this is not json"
    assert lines[1].startswith(f"2026-11-30 09:14:01.600  {'backend_failure'.ljust(WIDTH)}  ")


def test_render_all_merges_by_time_and_marks_watchdog_lines(logs: Path) -> None:
    status, lines = run("all", logs)
    assert status == 0
    mark = logview.WATCHDOG_MARK
    order = [event_name(line) if line.startswith(mark) else line for line in lines]
    server = START_OUT.splitlines()
    assert order == [
        server[0],  # before any timestamp: first
        server[1],
        "supervisor_started",  # 09:13:59.000
        server[2],  # 09:14:00.010
        server[3],  # 09:14:01.500
        "backend_failure",  # 09:14:01.600
        "restart_started",  # 09:14:02.117: at a tie the event precedes the log line
        "?",  # the malformed line keeps its place after the event before it
        server[4],  # 09:14:02.117
        server[5],  # inherits 09:14:02.117
        server[6],  # 09:14:03.000
        "supervisor_stopped",  # 09:14:05.000
    ]
    assert lines[7] == mark + "? this is not json"


def test_render_all_with_colour_marks_watchdog_lines_in_cyan(logs: Path) -> None:
    _status, lines = run("all", logs, colour=True)
    marked = [line for line in lines if "supervisor_started" in line]
    assert marked[0].startswith(logview.CYAN + logview.WATCHDOG_MARK + logview.RESET)


def test_render_raw_prints_both_files_unformatted(logs: Path) -> None:
    status, lines = run("raw", logs)
    assert status == 0
    assert lines == START_OUT.splitlines() + WATCHDOG.splitlines()


def test_render_keeps_a_last_line_without_newline(tmp_path: Path) -> None:
    (tmp_path / "start.out").write_text("first\nsecond without newline")
    assert run("server", tmp_path) == (0, ["first", "second without newline"])


@pytest.mark.parametrize("mode", ["server", "watchdog", "all", "raw"])
def test_render_with_no_files_says_so_and_fails(
    mode: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, lines = run(mode, tmp_path)
    assert (status, lines) == (1, [])
    err = capsys.readouterr().err
    assert "does not exist" in err
    assert all(line.startswith("logs: ") for line in err.splitlines())


def test_render_one_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "start.out").write_text(START_OUT)
    assert run("watchdog", tmp_path) == (1, [])
    assert f"{tmp_path / 'watchdog.jsonl'} does not exist" in capsys.readouterr().err
    status, lines = run("all", tmp_path)
    assert (status, lines) == (0, START_OUT.splitlines())
    assert "watchdog.jsonl does not exist" in capsys.readouterr().err


def test_log_file_reads_appended_lines_only_once_they_are_complete(tmp_path: Path) -> None:
    path = tmp_path / "start.out"
    reader = LogFile(path)
    try:
        assert reader.read_lines() == []
        path.write_text("one\ntw")
        assert reader.read_lines() == ["one"]
        with path.open("a") as handle:
            handle.write("o\r\nthree\n")
        assert reader.read_lines() == ["two", "three"]
        assert reader.read_lines() == []
    finally:
        reader.close()


def test_log_file_starts_over_after_truncation(tmp_path: Path) -> None:
    path = tmp_path / "start.out"
    path.write_text("a long first line\nand a second\n")
    reader = LogFile(path)
    try:
        assert len(reader.read_lines()) == 2
        path.write_text("new\n")
        assert reader.read_lines() == ["new"]
    finally:
        reader.close()


def test_log_file_follows_rotation_and_removal(tmp_path: Path) -> None:
    path = tmp_path / "start.out"
    path.write_text("old 1\n")
    reader = LogFile(path)
    try:
        assert reader.read_lines() == ["old 1"]
        with path.open("a") as handle:
            handle.write("old 2\nold tail")
        os.replace(path, tmp_path / "start.out.1")
        path.write_text("new 1\n")
        assert reader.read_lines() == ["old 2", "old tail", "new 1"]
        path.unlink()
        assert reader.read_lines() == []
        path.write_text("newer\n")
        assert reader.read_lines() == ["newer"]
    finally:
        reader.close()


class Appender(io.StringIO):
    """An output that, on each write, runs the next step of a scripted follow session."""

    def __init__(self, steps: list[Any]) -> None:
        super().__init__()
        self.steps = steps

    def flush(self) -> None:
        super().flush()
        if self.steps:
            self.steps.pop(0)()


def test_render_follow_prints_appended_lines_and_stops_on_sigterm(
    logs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(logview, "POLL_SECONDS", 0.01)
    watchdog = logs / "watchdog.jsonl"
    appended = record("restart_succeeded", ts="2026-11-30T09:15:00.000Z", **BACKEND)

    def append() -> None:
        with watchdog.open("a") as handle:
            handle.write(json.dumps(appended) + "\n")

    before = signal.getsignal(signal.SIGTERM)
    out = Appender([append, lambda: os.kill(os.getpid(), signal.SIGTERM)])
    assert render("watchdog", logs, watchdog, True, False, out) == 0
    lines = out.getvalue().splitlines()
    assert len(lines) == 6
    assert lines[-1] == format_event(appended)
    assert signal.getsignal(signal.SIGTERM) == before


def test_render_follow_stops_on_ctrl_c_outside_the_main_thread(
    logs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(logview, "POLL_SECONDS", 0.01)

    def interrupt() -> None:
        raise KeyboardInterrupt

    results: list[int] = []
    out = Appender([interrupt])
    worker = threading.Thread(
        target=lambda: results.append(
            render("server", logs, logs / "watchdog.jsonl", True, False, out)
        )
    )
    worker.start()
    worker.join(timeout=10)
    assert results == [0]


def test_main_survives_a_closed_pipe(logs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any) -> int:
        raise BrokenPipeError

    monkeypatch.setattr(logview, "render", broken)
    read_end, write_end = os.pipe()
    try:
        with os.fdopen(write_end, "w") as stream:
            monkeypatch.setattr(sys, "stdout", stream)
            assert logview.main("server", logs, logs / "watchdog.jsonl", False) == 0
            stream.write("lost\n")  # stdout now leads to /dev/null, not the pipe
        assert os.read(read_end, 100) == b""
    finally:
        os.close(read_end)
