"""The router's half of the watchdog: outcomes in, events and restart requests out."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from slm_server.contracts.events import EventLog
from slm_server.contracts.restart_requests import RestartRequest, take_requests
from slm_server.contracts.verdicts import (
    BROKEN,
    HEALTHY,
    PROGRESSING,
    STALLED,
    TIMED_OUT,
    UNREACHABLE,
    Outcome,
    classify_status,
)
from slm_server.registry.schema import ModelSpec, parse_registry
from slm_server.router.watchdog.tripwire import Progress, StallTimer, Tripwire
from slm_server.settings import WatchdogSettings
from tests.registry_entries import registry_entry, registry_yaml

WALL = 1_700_000_000.25
TS = "2023-11-14T22:13:20.250Z"

# Two models: (role, id, port, default_timeout, quantization), the file models/<role>.gguf.
MODELS = (
    ("standard", "smollm2-135m-instruct", 8501, 120, "Q4_1"),
    ("fast", "tiny-model", 8502, 60, "Q8_0"),
)
REGISTRY = "models:\n" + "".join(
    registry_yaml(
        role,
        registry_entry(
            model_id,
            port,
            model_path=f"models/{role}.gguf",
            default_timeout=timeout,
            quantization=quantization,
        ),
    )
    for role, model_id, port, timeout, quantization in MODELS
)
SPECS = {spec.role: spec for spec in parse_registry(REGISTRY, Path("models.yaml")).models}
STANDARD = SPECS["standard"]
FAST = SPECS["fast"]
IDS = {"role": "standard", "model_id": "smollm2-135m-instruct", "port": 8501}


def settings_in(tmp_path: Path, **overrides: Any) -> WatchdogSettings:
    base = WatchdogSettings(
        enabled=True,
        failure_threshold=2,
        stall_seconds=300.0,
        sweep_seconds=5.0,
        max_restarts=5,
        restart_window_seconds=600.0,
        restart_cooldown_seconds=10.0,
        startup_grace_seconds=180.0,
        request_dir=tmp_path / "requests",
        log_path=tmp_path / "logs" / "watchdog.jsonl",
        backend_log_max_mb=100.0,
    )
    return replace(base, **overrides)


def tripwire(
    tmp_path: Path, wall: Callable[[], float] = lambda: WALL, **overrides: Any
) -> Tripwire:
    settings = settings_in(tmp_path, **overrides)
    return Tripwire(settings, EventLog(settings.log_path, wall=wall), wall=wall)


def events(wire: Tripwire) -> list[dict[str, Any]]:
    path = wire.settings.log_path
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def request_files(wire: Tripwire) -> list[Path]:
    directory = wire.settings.request_dir
    return sorted(directory.iterdir()) if directory.exists() else []


def observe(wire: Tripwire, *items: int | Outcome, spec: ModelSpec = STANDARD) -> None:
    for item in items:
        wire.observe(spec, classify_status(item) if isinstance(item, int) else item)


# --- outcomes --------------------------------------------------------------------------


def test_health_emits_nothing(tmp_path: Path) -> None:
    wire = tripwire(tmp_path)
    observe(wire, 200, 204, 400, 404, 422, HEALTHY)
    assert not wire.settings.log_path.exists()
    assert request_files(wire) == []


def test_a_failure_emits_backend_failure(tmp_path: Path) -> None:
    wire = tripwire(tmp_path)
    wire.observe(STANDARD, classify_status(503), detail="upstream said 503")
    assert events(wire) == [
        {
            "ts": TS,
            "event": "backend_failure",
            **IDS,
            "reason": "5xx",
            "status": 503,
            "streak": 1,
            "detail": "upstream said 503",
        }
    ]
    assert request_files(wire) == []
    assert wire.open_streak("standard") == 1


@pytest.mark.parametrize(
    ("outcome", "reason"),
    [
        (UNREACHABLE, "unreachable"),
        (TIMED_OUT, "timeout"),
        (BROKEN, "broken_connection"),
    ],
)
def test_transport_failures_have_no_status(tmp_path: Path, outcome: Outcome, reason: str) -> None:
    wire = tripwire(tmp_path)
    wire.observe(STANDARD, outcome)
    assert events(wire) == [
        {"ts": TS, "event": "backend_failure", **IDS, "reason": reason, "streak": 1}
    ]


@pytest.mark.parametrize(
    ("status", "reason"), [(408, "timeout"), (425, "saturated"), (429, "saturated")]
)
def test_4xx_failures(tmp_path: Path, status: int, reason: str) -> None:
    wire = tripwire(tmp_path)
    observe(wire, status)
    [event] = events(wire)
    assert event["event"] == "backend_failure"
    assert event["reason"] == reason
    assert event["status"] == status


@pytest.mark.parametrize("status", [199, 301, 401, 403, 405, 409, 413, 418, 499])
def test_an_ignored_status_emits_unclassified_status(tmp_path: Path, status: int) -> None:
    wire = tripwire(tmp_path)
    observe(wire, status)
    assert events(wire) == [{"ts": TS, "event": "unclassified_status", **IDS, "status": status}]
    assert wire.open_streak("standard") == 0
    assert request_files(wire) == []


def test_streak_counts_are_logged(tmp_path: Path) -> None:
    wire = tripwire(tmp_path, failure_threshold=3)
    observe(wire, 500, 502)
    assert [e["streak"] for e in events(wire)] == [1, 2]
    assert request_files(wire) == []


def test_health_resets_the_logged_streak(tmp_path: Path) -> None:
    wire = tripwire(tmp_path)
    observe(wire, 500, 200, 500)
    assert [(e["event"], e["streak"]) for e in events(wire)] == [
        ("backend_failure", 1),
        ("backend_failure", 1),
    ]
    assert request_files(wire) == []


def test_ignored_status_does_not_reset(tmp_path: Path) -> None:
    wire = tripwire(tmp_path)
    observe(wire, 500, 418, 500)
    assert [e["event"] for e in events(wire)] == [
        "backend_failure",
        "unclassified_status",
        "backend_failure",
        "restart_requested",
    ]
    assert len(request_files(wire)) == 1


# --- trips -----------------------------------------------------------------------------


def test_a_trip_writes_a_request_and_logs_it(tmp_path: Path) -> None:
    wire = tripwire(tmp_path)
    observe(wire, 500)
    wire.observe(STANDARD, classify_status(502), detail="second")
    [path] = request_files(wire)
    assert path.name.startswith("8501-standard-")
    assert path.suffix == ".json"
    assert json.loads(path.read_text(encoding="utf-8")) == {
        "role": "standard",
        "model_id": "smollm2-135m-instruct",
        "port": 8501,
        "reason": "5xx",
        "requested_at": WALL,
        "detail": "second",
    }
    assert events(wire) == [
        {"ts": TS, "event": "backend_failure", **IDS, "reason": "5xx", "status": 500, "streak": 1},
        {
            "ts": TS,
            "event": "backend_failure",
            **IDS,
            "reason": "5xx",
            "status": 502,
            "streak": 2,
            "detail": "second",
        },
        {
            "ts": TS,
            "event": "restart_requested",
            **IDS,
            "reason": "5xx",
            "streak": 2,
            "file": path.name,
            "detail": "second",
        },
    ]
    assert wire.open_streak("standard") == 0


def test_the_request_is_readable_by_the_supervisor(tmp_path: Path) -> None:
    wire = tripwire(tmp_path)
    observe(wire, 429, 429)
    assert take_requests(wire.settings.request_dir) == [
        RestartRequest("standard", "smollm2-135m-instruct", 8501, "saturated", WALL)
    ]


def test_requested_at_follows_the_wall_clock(tmp_path: Path) -> None:
    now = [WALL]
    wire = tripwire(tmp_path, wall=lambda: now[0])
    observe(wire, 500, 500)
    now[0] += 42.0
    observe(wire, UNREACHABLE, UNREACHABLE)
    taken = take_requests(wire.settings.request_dir)
    assert [(r.reason, r.requested_at) for r in taken if isinstance(r, RestartRequest)] == [
        ("5xx", WALL),
        ("unreachable", WALL + 42.0),
    ]


def test_classes_counted_separately_in_the_tripwire(tmp_path: Path) -> None:
    wire = tripwire(tmp_path)
    observe(wire, 500, 429)
    assert request_files(wire) == []
    observe(wire, 500)
    [event] = [e for e in events(wire) if e["event"] == "restart_requested"]
    assert event["reason"] == "5xx"
    assert event["streak"] == 2


def test_a_trip_starts_over(tmp_path: Path) -> None:
    wire = tripwire(tmp_path)
    observe(wire, 500, 500, 500)
    assert len(request_files(wire)) == 1
    assert events(wire)[-1]["streak"] == 1
    observe(wire, 500)
    assert len(request_files(wire)) == 2


def test_threshold_one_trips_on_the_first_failure(tmp_path: Path) -> None:
    wire = tripwire(tmp_path, failure_threshold=1)
    observe(wire, 503)
    assert [e["event"] for e in events(wire)] == ["backend_failure", "restart_requested"]
    assert len(request_files(wire)) == 1


def test_a_stall_outcome_trips_at_once(tmp_path: Path) -> None:
    wire = tripwire(tmp_path, failure_threshold=5)
    wire.observe(STANDARD, STALLED, detail="slow")
    [path] = request_files(wire)
    assert json.loads(path.read_text(encoding="utf-8"))["reason"] == "stall"
    assert [(e["event"], e["reason"], e["streak"]) for e in events(wire)] == [
        ("backend_failure", "stall", 1),
        ("restart_requested", "stall", 1),
    ]


def test_streaks_are_per_backend(tmp_path: Path) -> None:
    wire = tripwire(tmp_path)
    observe(wire, 500, spec=STANDARD)
    observe(wire, 500, spec=FAST)
    assert request_files(wire) == []
    assert wire.open_streak("standard") == 1
    assert wire.open_streak("fast") == 1
    observe(wire, 500, spec=FAST)
    [path] = request_files(wire)
    assert path.name.startswith("8502-fast-")
    assert wire.open_streak("standard") == 1
    assert wire.open_streak("fast") == 0


def test_unwritable_request_dir_logs_and_carries_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("a file")
    wire = tripwire(tmp_path, request_dir=blocker / "requests")
    observe(wire, 500, 500)
    assert [e["event"] for e in events(wire)] == ["backend_failure", "backend_failure"]
    assert any("cannot write a restart request" in r.getMessage() for r in caplog.records)
    assert wire.open_streak("standard") == 0


# --- disabled --------------------------------------------------------------------------


def test_disabled_does_nothing(tmp_path: Path) -> None:
    wire = tripwire(tmp_path, enabled=False, failure_threshold=1)
    observe(wire, 500, 500, 418, 429, STALLED, UNREACHABLE, 200)
    assert not wire.settings.log_path.exists()
    assert not wire.settings.request_dir.exists()
    assert list(tmp_path.iterdir()) == []
    assert wire.open_streak("standard") == 0


def test_disabled_stall_timer_needs_no_loop(tmp_path: Path) -> None:
    wire = tripwire(tmp_path, enabled=False)
    timer = wire.stall_timer(STANDARD)
    assert isinstance(timer, StallTimer)
    timer.first_byte()
    timer.cancel()
    assert list(tmp_path.iterdir()) == []


def test_disabled_stall_timer_in_a_loop_never_fires(tmp_path: Path) -> None:
    wire = tripwire(tmp_path, enabled=False, stall_seconds=0.01)

    async def scenario() -> None:
        wire.stall_timer(STANDARD)
        await asyncio.sleep(0.05)

    asyncio.run(scenario())
    assert list(tmp_path.iterdir()) == []


def test_enabled_stall_timer_outside_a_loop_raises(tmp_path: Path) -> None:
    wire = tripwire(tmp_path)
    with pytest.raises(RuntimeError):
        wire.stall_timer(STANDARD)


# --- stall timers ----------------------------------------------------------------------

STALL = 0.05


async def wait_for_request(wire: Tripwire, deadline: float = 2.0) -> list[Path]:
    loop = asyncio.get_running_loop()
    give_up = loop.time() + deadline
    while loop.time() < give_up:
        files = request_files(wire)
        if files:
            return files
        await asyncio.sleep(0.01)
    return request_files(wire)


async def past_the_deadline(seconds: float) -> None:
    """Wait on a timer of our own that is due well after the stall timer."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    loop.call_later(seconds, done.set_result, None)
    await done


def test_stall_timer_trips(tmp_path: Path) -> None:
    wire = tripwire(tmp_path, stall_seconds=STALL)

    async def scenario() -> list[Path]:
        wire.stall_timer(STANDARD)
        return await wait_for_request(wire)

    files = asyncio.run(scenario())
    assert len(files) == 1
    taken = take_requests(wire.settings.request_dir)
    detail = "no first byte within 0.05s on a streaming request"
    assert taken == [
        RestartRequest("standard", "smollm2-135m-instruct", 8501, "stall", WALL, detail)
    ]
    assert [(e["event"], e["reason"], e["streak"], e["detail"]) for e in events(wire)] == [
        ("backend_failure", "stall", 1, detail),
        ("restart_requested", "stall", 1, detail),
    ]


def test_stall_timer_trips_despite_a_high_threshold(tmp_path: Path) -> None:
    wire = tripwire(tmp_path, stall_seconds=STALL, failure_threshold=10)

    async def scenario() -> list[Path]:
        wire.stall_timer(FAST)
        return await wait_for_request(wire)

    [path] = asyncio.run(scenario())
    assert path.name.startswith("8502-fast-")


def test_first_byte_prevents_the_trip(tmp_path: Path) -> None:
    wire = tripwire(tmp_path, stall_seconds=STALL)

    async def scenario() -> None:
        timer = wire.stall_timer(STANDARD)
        await asyncio.sleep(0)
        timer.first_byte()
        await past_the_deadline(STALL * 4)

    asyncio.run(scenario())
    assert request_files(wire) == []
    assert events(wire) == []


def test_cancel_prevents_the_trip(tmp_path: Path) -> None:
    wire = tripwire(tmp_path, stall_seconds=STALL)

    async def scenario() -> None:
        timer = wire.stall_timer(STANDARD)
        timer.cancel()
        timer.cancel()
        timer.first_byte()
        await past_the_deadline(STALL * 4)

    asyncio.run(scenario())
    assert request_files(wire) == []
    assert events(wire) == []


def test_only_the_unanswered_timer_trips(tmp_path: Path) -> None:
    wire = tripwire(tmp_path, stall_seconds=STALL)

    async def scenario() -> list[Path]:
        answered = wire.stall_timer(STANDARD)
        wire.stall_timer(FAST)
        answered.first_byte()
        files = await wait_for_request(wire)
        await past_the_deadline(STALL * 2)
        return files

    [path] = asyncio.run(scenario())
    assert path.name.startswith("8502-fast-")
    assert request_files(wire) == [path]
    assert {e["role"] for e in events(wire)} == {"fast"}


def test_first_byte_after_the_stall_is_harmless(tmp_path: Path) -> None:
    wire = tripwire(tmp_path, stall_seconds=STALL)

    async def scenario() -> None:
        timer = wire.stall_timer(STANDARD)
        await wait_for_request(wire)
        timer.first_byte()
        timer.cancel()

    asyncio.run(scenario())
    assert len(request_files(wire)) == 1


# --- deadlines -------------------------------------------------------------------------


def test_progress_before_any_byte_counts_from_the_send() -> None:
    progress = Progress(sent_at=10.0)
    assert progress.silence(10.0) == 0.0
    assert not progress.delivered
    progress.waiting(11.0)  # the head came: still nothing of the body
    assert progress.silence(99.0) == 89.0, "measured from the send, not the head"


def test_progress_measures_the_current_wait_only() -> None:
    progress = Progress(sent_at=9.0)
    progress.waiting(10.0)
    progress.arrived()
    assert progress.delivered
    assert progress.silence(50.0) == 0.0, "not waiting on the backend: it holds nothing up"
    progress.waiting(12.0)
    assert progress.silence(12.5) == 0.5
    progress.arrived()
    progress.waiting(20.0)
    assert progress.silence(23.0) == 3.0


def test_a_slow_client_is_not_backend_silence() -> None:
    """Blocked sending to the client for a long time, then back to the backend, which
    answers at once: the backend was never silent."""
    progress = Progress(sent_at=0.0)
    progress.waiting(0.0)
    progress.arrived()  # a chunk, then 30 s of a client that does not read
    assert progress.silence(30.0) == 0.0
    progress.waiting(30.0)
    assert progress.silence(30.2) == pytest.approx(0.2)


NOW = 100.0


def nothing_for(seconds: float) -> Progress:
    """A request sent ``seconds`` before NOW, with no byte of the answer since."""
    return Progress(sent_at=NOW - seconds)


def silent_for(seconds: float) -> Progress:
    """A request that delivered something, then nothing for ``seconds`` before NOW."""
    progress = Progress(sent_at=0.0)
    progress.arrived()
    progress.waiting(NOW - seconds)
    return progress


def test_a_deadline_with_nothing_delivered_is_a_timeout(tmp_path: Path) -> None:
    wire = tripwire(tmp_path, stall_seconds=1.5)
    detail = "The backend for 'smollm2-135m-instruct' did not answer within 2s"
    assert wire.deadline(STANDARD, nothing_for(2.0), NOW, detail) == TIMED_OUT
    assert events(wire) == [
        {
            "ts": TS,
            "event": "backend_failure",
            **IDS,
            "reason": "timeout",
            "streak": 1,
            "detail": detail,
        }
    ]


def test_a_deadline_after_silence_past_the_stall_threshold_is_a_timeout(tmp_path: Path) -> None:
    wire = tripwire(tmp_path, stall_seconds=1.5)
    assert wire.deadline(STANDARD, silent_for(1.8), NOW, "cut") == TIMED_OUT
    assert wire.deadline(STANDARD, silent_for(1.5), NOW, "cut") == TIMED_OUT
    [first, second, requested] = events(wire)
    assert (first["reason"], first["streak"]) == ("timeout", 1)
    assert first["detail"] == "cut; nothing from the backend for 1.8s"
    assert (second["event"], second["streak"]) == ("backend_failure", 2)
    assert requested["event"] == "restart_requested"
    assert requested["reason"] == "timeout"
    assert len(request_files(wire)) == 1


def test_a_deadline_that_cuts_progress_counts_for_nothing(tmp_path: Path) -> None:
    wire = tripwire(tmp_path, stall_seconds=1.5)
    for _ in range(5):
        assert wire.deadline(STANDARD, silent_for(0.4), NOW, "streaming") == PROGRESSING
    assert wire.open_streak("standard") == 0
    assert request_files(wire) == []
    assert events(wire)[0] == {
        "ts": TS,
        "event": "deadline_not_counted",
        **IDS,
        "delivered": True,
        "silent_seconds": 0.4,
        "needed_seconds": 1.5,
        "stall_seconds": 1.5,
        "detail": "streaming",
    }
    assert [e["event"] for e in events(wire)] == ["deadline_not_counted"] * 5


def test_a_deadline_the_queue_used_up_is_no_evidence(tmp_path: Path) -> None:
    """The router queued the request for most of its deadline; the backend had it for
    less than the stall threshold with nothing back yet: it never had a fair chance."""
    wire = tripwire(tmp_path, stall_seconds=1.5)
    for _ in range(3):
        assert wire.deadline(STANDARD, nothing_for(0.4), NOW, "queued") == PROGRESSING
    assert wire.open_streak("standard") == 0
    assert request_files(wire) == []
    assert events(wire)[0] == {
        "ts": TS,
        "event": "deadline_not_counted",
        **IDS,
        "delivered": False,
        "silent_seconds": 0.4,
        "needed_seconds": 1.5,
        "stall_seconds": 1.5,
        "detail": "queued",
    }


def test_with_a_long_stall_threshold_half_the_deadline_with_nothing_counts(
    tmp_path: Path,
) -> None:
    """The defaults (stall 300 s, deadline 120 s): a request that got nothing in the 60 s
    or more it was at the backend counts; one the queue left 59 s does not."""
    wire = tripwire(tmp_path, stall_seconds=300.0)
    assert wire.deadline(STANDARD, nothing_for(59.0), NOW, "cut") == PROGRESSING
    assert events(wire)[-1]["needed_seconds"] == 60.0
    assert wire.deadline(STANDARD, nothing_for(60.0), NOW, "cut") == TIMED_OUT
    assert wire.deadline(STANDARD, nothing_for(120.0), NOW, "cut") == TIMED_OUT
    assert [e["event"] for e in events(wire)][-1] == "restart_requested"


def test_a_progressing_cut_neither_ends_nor_extends_a_streak(tmp_path: Path) -> None:
    wire = tripwire(tmp_path, stall_seconds=1.5)
    observe(wire, 500)
    wire.deadline(STANDARD, silent_for(0.1), NOW, "streaming")
    assert wire.open_streak("standard") == 1
    observe(wire, 500)
    assert [e["event"] for e in events(wire)] == [
        "backend_failure",
        "deadline_not_counted",
        "backend_failure",
        "restart_requested",
    ]


def test_a_disabled_watchdog_judges_no_deadline(tmp_path: Path) -> None:
    wire = tripwire(tmp_path, enabled=False)
    wire.deadline(STANDARD, nothing_for(5.0), NOW, "cut")
    wire.deadline(STANDARD, silent_for(0.1), NOW, "cut")
    assert not wire.settings.log_path.exists()
