"""The timeline's mapping: which lane state each watchdog event begins and which mark
it leaves (the contract's table, event by event), what a published state shows as, and
which log lines become events."""

from __future__ import annotations

import datetime
import json

import pytest

from slm_server.contracts.events import EVENTS
from slm_server.contracts.states import State
from slm_server.router.dashboard import timeline
from slm_server.router.dashboard.timeline import LANES, event_of, events_of, lane_of

# The contract (notes/dashboard-contract.md), written out here so that the code's
# tables are checked against it rather than against themselves.
CONTRACT_LANES = {
    "loading": ["backend_loading"],
    "ready": ["backend_loaded", "restart_succeeded", "restart_not_confirmed", "remote_readmitted"],
    "suspected": ["backend_failure", "remote_ejected"],
    "confirming": ["restart_requested"],
    "restarting": [
        "restart_confirmed",
        "backend_exited",
        "backend_not_running",
        "restart_started",
        "restart_failed",
    ],
    "abandoned": ["backend_abandoned"],
    "unloaded": ["backend_unloaded", "evicted_for_pressure"],
    "retired": ["backend_retiring", "backend_retired"],
}
CONTRACT_MARKS = {
    "restart_succeeded": "restart",
    "backend_loaded": "load",
    "backend_unloaded": "unload",
    "evicted_for_pressure": "eviction",
    "config_reloaded": "reload",
}
TS = "2026-12-01T10:00:05.250Z"
TS_SECONDS = datetime.datetime(2026, 12, 1, 10, 0, 5, 250000, tzinfo=datetime.UTC).timestamp()


def line(event: str, **fields: object) -> str:
    return json.dumps({"ts": TS, "event": event, **fields})


@pytest.mark.parametrize(
    ("event", "lane"), [(e, lane) for lane, events in CONTRACT_LANES.items() for e in events]
)
def test_each_event_begins_the_lane_the_contract_names(event: str, lane: str) -> None:
    found = event_of(line(event, role="chat", model_id="org/chat"))
    assert found is not None
    assert found.lane == lane
    assert found.mark == CONTRACT_MARKS.get(event)


def test_the_tables_are_the_contracts_and_name_real_events_and_lanes() -> None:
    lanes = {e: lane for lane, events in CONTRACT_LANES.items() for e in events}
    assert lanes == timeline.EVENT_LANES
    assert timeline.EVENT_MARKS == CONTRACT_MARKS
    assert set(lanes) | set(CONTRACT_MARKS) <= EVENTS  # every one is an event the log has
    assert set(lanes.values()) <= set(LANES)


def test_a_reload_leaves_a_mark_and_begins_no_lane() -> None:
    found = event_of(line("config_reloaded", source="file"))
    assert found is not None
    assert found.to_json() == {
        "ts": TS_SECONDS,
        "event": "config_reloaded",
        "role": None,
        "model": None,
        "lane": None,
        "mark": "reload",
        "reason": None,
    }


def test_an_event_keeps_its_time_backend_model_and_reason() -> None:
    found = event_of(line("restart_succeeded", role="chat", model_id="org/chat", reason="stall"))
    assert found is not None
    assert found.to_json() == {
        "ts": TS_SECONDS,
        "event": "restart_succeeded",
        "role": "chat",
        "model": "org/chat",
        "lane": "ready",
        "mark": "restart",
        "reason": "stall",
    }
    long = event_of(line("backend_exited", reason="x" * 10_000))
    assert long is not None and long.reason is not None and len(long.reason) == 200


@pytest.mark.parametrize(
    ("char", "kept"),
    [("x", 1), ("\xe9", 1), ("\u0100", 2), ("\u4e2d", 2), ("\U0001f600", 4)],
)
def test_a_long_field_is_cut_by_the_memory_its_characters_take(char: str, kept: int) -> None:
    """A name and a reason keep 128 and 200 characters stored a byte each, half as many
    when one character takes 2 bytes, a quarter when it takes 4 (one such character is
    enough: the whole string is stored that wide)."""
    found = event_of(
        line("backend_exited", role=char * 1000, model_id="m" + char * 1000, reason=char * 1000)
    )
    assert found is not None and found.role is not None and found.model is not None
    assert found.role == char * (timeline.MAX_NAME_CHARS // kept)
    assert found.model == ("m" + char * 1000)[: timeline.MAX_NAME_CHARS // kept]
    assert found.reason == char * (timeline.MAX_REASON_CHARS // kept)


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[1, 2]",
        json.dumps({"ts": TS, "event": "memory_grew", "role": "chat"}),  # no lane, no mark
        json.dumps({"ts": "yesterday", "event": "backend_exited"}),
        json.dumps({"event": "backend_exited"}),
        json.dumps({"ts": TS, "event": 5}),
    ],
)
def test_other_lines_are_no_events(text: str) -> None:
    assert event_of(text) is None


def test_events_of_keeps_the_order_and_drops_the_rest() -> None:
    lines = [line("backend_exited", n=1), "junk", line("restart_started"), line("cache_saved")]
    assert [e.event for e in events_of(lines)] == ["backend_exited", "restart_started"]


@pytest.mark.parametrize(
    ("published", "supervised", "failing", "lane"),
    [
        ("ready", True, False, "ready"),
        ("ready", True, True, "suspected"),  # degraded
        ("ejected", True, False, "suspected"),
        ("restarting", True, True, "restarting"),
        ("ready", False, False, "unknown"),  # unsupervised
        (None, True, False, "unknown"),
        ("something new", True, False, "unknown"),
    ],
)
def test_a_published_state_shows_as_its_lane(
    published: str | None, supervised: bool, failing: bool, lane: str
) -> None:
    assert lane_of(published, supervised=supervised, failing=failing) == lane


def test_every_supervisor_state_is_a_lane_of_its_own() -> None:
    for state in State:
        assert lane_of(state.value, supervised=True, failing=False) == state.value


def test_an_exit_says_what_ended_the_process() -> None:
    killed = event_of(line("backend_exited", role="chat", signal="SIGKILL", exit_code=None))
    assert killed is not None and killed.reason == "killed by SIGKILL"
    ended = event_of(line("backend_exited", role="chat", exit_code=3))
    assert ended is not None and ended.reason == "exit code 3"
    said = event_of(line("backend_exited", role="chat", signal="SIGKILL", reason="own words"))
    assert said is not None and said.reason == "own words"


def test_a_line_whose_fields_python_cannot_turn_into_text_or_time_is_no_event() -> None:
    """JSON holds integers no float can (a forged time), and lists nested as deep as the
    parser allows: such a line is passed over, never an error that would stop the
    reading of the lines beside it (or, at the start, every sample after)."""
    huge = '{"event": "backend_loaded", "ts": 1' + "0" * 400 + ', "role": "a"}'
    assert event_of(huge) is None
    deep = '{"event": "backend_exited", "ts": 1, "signal": ' + "[" * 900 + "]" * 900 + "}"
    exited = event_of(deep)
    assert exited is None or isinstance(exited.reason, str)
    assert [e.role for e in events_of([huge, line("backend_loaded", role="b")])] == ["b"]


def test_a_lone_surrogate_in_a_field_is_kept_as_text_that_encodes() -> None:
    r"""``"\ud800"`` is valid JSON and a str no UTF-8 encoder takes: the answer that
    shows the event would fail as a whole."""
    found = event_of(
        '{"event": "backend_failure", "ts": 1, "role": "\\ud800r", "model_id": "m\\udfff",'
        ' "reason": "why \\ud800"}'
    )
    assert found is not None
    shown = json.dumps(found.to_json(), ensure_ascii=False)
    shown.encode("utf-8")  # no UnicodeEncodeError
    assert found.role is not None and found.role.endswith("r")
    assert found.reason is not None and found.reason.startswith("why ")
