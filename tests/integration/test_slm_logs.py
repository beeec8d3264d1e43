"""``scripts/slm-logs.sh`` as a user runs it: a real bash process reading a log directory
(``SLM_BACKEND_LOG_DIR``) that holds a small ``start.out`` and ``watchdog.jsonl``."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.processes import ROOT, poll

SCRIPT = "scripts/slm-logs.sh"

START_OUT = """\
[start] 2026-11-30 10:13:58 starting slm_server in /srv/slm
2026-11-30T09:14:00.010Z [backends] INFO starting reasoning (unsloth/qwen3) on port 8502
2026-11-30T09:14:01.500Z [router] WARNING upstream reasoning answered 500
2026-11-30T09:14:03.000Z [backends] INFO reasoning (unsloth/qwen3) ready on port 8502
"""

BACKEND = {"role": "reasoning", "model_id": "unsloth/qwen3", "port": 8502}
EVENTS: list[dict[str, Any]] = [
    {"ts": "2026-11-30T09:13:59.000Z", "event": "supervisor_started", "pid": 35550},
    {"ts": "2026-11-30T09:14:01.600Z", "event": "backend_failure", **BACKEND, "reason": "5xx"},
    {
        "ts": "2026-11-30T09:14:02.117Z",
        "event": "restart_succeeded",
        **BACKEND,
        "reason": "stall",
        "old_pid": 35559,
        "new_pid": 41220,
        "attempt": 1,
    },
]
WATCHDOG = "".join(json.dumps(e) + "\n" for e in EVENTS) + "garbage line\n"

SUPERVISOR_STARTED = "2026-11-30 09:13:59.000  supervisor_started"
FAILURE = "2026-11-30 09:14:01.600  backend_failure"
RESTARTED = (
    "restart_succeeded        reasoning (unsloth/qwen3) :8502  "
    "reason=stall old_pid=35559 new_pid=41220 attempt=1"
)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    (log_dir / "start.out").write_text(START_OUT)
    (log_dir / "watchdog.jsonl").write_text(WATCHDOG)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SLM_")}
    return {
        **clean,
        "SLM_BACKEND_LOG_DIR": str(log_dir),
        "SLM_ENV_FILE": str(tmp_path / "no.env"),
    }


def slm_logs(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", SCRIPT, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_no_argument_shows_the_server_output(env: dict[str, str]) -> None:
    result = slm_logs(env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == START_OUT
    assert "\x1b[" not in result.stdout


def test_watchdog_is_a_readable_timeline(env: dict[str, str]) -> None:
    result = slm_logs(env, "watchdog")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 4
    assert lines[0].startswith(SUPERVISOR_STARTED)
    assert lines[0].endswith("supervisor  pid=35550")
    assert lines[1] == f"{FAILURE}          reasoning (unsloth/qwen3) :8502  reason=5xx"
    assert lines[2] == f"2026-11-30 09:14:02.117  {RESTARTED}"
    assert lines[3] == "? garbage line"


def test_all_merges_both_logs_in_time_order(env: dict[str, str]) -> None:
    result = slm_logs(env, "all")
    assert result.returncode == 0, result.stderr
    server = START_OUT.splitlines()
    lines = result.stdout.splitlines()
    assert lines[0] == server[0]
    assert lines[1].startswith(f"[watchdog] {SUPERVISOR_STARTED}")
    assert lines[2:4] == server[1:3]
    assert lines[4].startswith(f"[watchdog] {FAILURE}")
    assert lines[5].endswith(RESTARTED)
    assert lines[6] == "[watchdog] ? garbage line"
    assert lines[7] == server[3]
    assert len(lines) == 8


def test_raw_prints_both_files_as_they_are(env: dict[str, str]) -> None:
    result = slm_logs(env, "raw")
    assert result.returncode == 0, result.stderr
    assert result.stdout == START_OUT + WATCHDOG


def test_missing_logs_fail_with_one_line_each(env: dict[str, str], tmp_path: Path) -> None:
    env = {**env, "SLM_BACKEND_LOG_DIR": str(tmp_path / "empty")}
    result = slm_logs(env, "watchdog")
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"logs: {tmp_path / 'empty' / 'watchdog.jsonl'} does not exist (no watchdog event yet)"
    ]
    assert slm_logs(env, "all").returncode == 1


def test_help_and_bad_arguments(env: dict[str, str]) -> None:
    helped = slm_logs(env, "--help")
    assert helped.returncode == 0
    assert helped.stdout.startswith("usage: scripts/slm-logs.sh [watchdog|all|raw] [-f]")
    bad = slm_logs(env, "everything")
    assert bad.returncode == 2
    assert "unknown argument: everything" in bad.stderr
    assert slm_logs(env, "all", "raw").returncode == 2


def test_follow_prints_appended_events_and_stops_on_sigterm(
    env: dict[str, str], tmp_path: Path
) -> None:
    watchdog = Path(env["SLM_BACKEND_LOG_DIR"]) / "watchdog.jsonl"
    out, err = tmp_path / "follow.out", tmp_path / "follow.err"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        follower = subprocess.Popen(
            ["bash", SCRIPT, "-f", "watchdog"],
            cwd=ROOT,
            env=env,
            stdout=stdout,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        poll(
            lambda: "? garbage line" in out.read_text() or follower.poll() is not None,
            30,
            "the existing events",
        )
        assert follower.poll() is None, err.read_text()
        event = {
            "ts": "2026-11-30T09:20:00.250Z",
            "event": "backend_abandoned",
            **BACKEND,
            "reason": "5 restarts within 600s; last reason: stall",
        }
        with watchdog.open("a") as handle:
            handle.write(json.dumps(event) + "\n")
        expected = (
            "2026-11-30 09:20:00.250  backend_abandoned        reasoning (unsloth/qwen3) :8502  "
            'reason="5 restarts within 600s; last reason: stall"'
        )
        poll(lambda: expected in out.read_text(), 30, "the appended event")
        follower.send_signal(signal.SIGTERM)
        assert follower.wait(timeout=5) == 0
    finally:
        if follower.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(follower.pid, signal.SIGKILL)
            follower.wait()
    assert out.read_text().splitlines()[-1] == expected
    assert "Traceback" not in err.read_text()
    assert err.read_text() == ""
