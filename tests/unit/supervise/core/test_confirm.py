"""Confirmation's decision table: every row, the order of the rows, the rendering."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from slm_server.supervise.core.confirm import (
    NOT_RUN_DECIDED,
    TABLE,
    Evidence,
    NotRun,
    Probe,
    ProcessStatus,
    Reply,
    Rule,
    Slots,
    judge,
    table_markdown,
)

WATCHDOG_PAGE = Path(__file__).resolve().parents[4] / "docs" / "watchdog.md"

HEALTHY = Probe(Reply.OK, status=200)
IDLE_CPU: dict[str, Any] = {"cpu_seconds_delta": 0.0, "window_seconds": 1.0}
BUSY_CPU: dict[str, Any] = {"cpu_seconds_delta": 0.9, "window_seconds": 1.0}
FREE = Slots(total=2, busy=1, busy_after=1, progressed=False)
ALL_BUSY_STILL = Slots(total=2, busy=2, busy_after=2, progressed=False)
ALL_BUSY_MOVING = Slots(total=2, busy=2, busy_after=2, progressed=True)
NO_FREE_SLOT = Probe(Reply.NOT_RUN, not_run=NotRun.NO_FREE_SLOT)


def canary(reply: Reply, status: int | None = None) -> Probe:
    return Probe(reply, status=status)


def evidence(**fields: Any) -> Evidence:
    """Running, healthy, no slots, canary not run, no CPU: override what a row needs."""
    base = Evidence(process=ProcessStatus.RUNNING, health=HEALTHY, **IDLE_CPU)
    return replace(base, **fields)


ROWS: list[tuple[Rule, Evidence]] = [
    (Rule.PROCESS_GONE, Evidence(process=ProcessStatus.GONE)),
    (Rule.PROCESS_ZOMBIE, Evidence(process=ProcessStatus.ZOMBIE)),
    (Rule.PROCESS_STOPPED, Evidence(process=ProcessStatus.STOPPED)),
    (Rule.HEALTH_FAILED, evidence(health=Probe(Reply.FAILED, status=503))),
    (Rule.CANARY_OK, evidence(canary=canary(Reply.OK, 200))),
    (Rule.CANARY_ANSWERED, evidence(canary=canary(Reply.FAILED, 400))),
    (Rule.BUSY_PROGRESSING, evidence(slots=ALL_BUSY_MOVING, canary=NO_FREE_SLOT)),
    (Rule.BUSY_WEDGED, evidence(slots=ALL_BUSY_STILL, canary=NO_FREE_SLOT)),
    (Rule.CANARY_5XX, evidence(canary=canary(Reply.FAILED, 500))),
    (Rule.SATURATED_WITH_FREE_SLOT, evidence(slots=FREE, canary=canary(Reply.FAILED, 429))),
    (Rule.SATURATED_PROGRESSING, evidence(canary=canary(Reply.FAILED, 429), **BUSY_CPU)),
    (Rule.SATURATED_IDLE, evidence(canary=canary(Reply.FAILED, 425))),
    (Rule.UNANSWERED_PROGRESSING, evidence(canary=canary(Reply.TIMED_OUT), **BUSY_CPU)),
    (Rule.UNANSWERED_IDLE, evidence(canary=canary(Reply.TIMED_OUT))),
    (
        Rule.NO_CANARY_PROGRESSING,
        evidence(canary=Probe(Reply.NOT_RUN, not_run=NotRun.UNSUPPORTED), **BUSY_CPU),
    ),
    (
        Rule.NO_CANARY_FOR_TYPE_IDLE,
        evidence(canary=Probe(Reply.NOT_RUN, not_run=NotRun.UNSUPPORTED)),
    ),
    (Rule.NO_CANARY_IDLE, evidence(canary=Probe(Reply.NOT_RUN, not_run=NotRun.NO_BUDGET))),
]


def test_every_row_of_the_table_has_a_case() -> None:
    assert [rule for rule, _ in ROWS] == [row.rule for row in TABLE]


@pytest.mark.parametrize(("rule", "case"), ROWS, ids=[rule.value for rule, _ in ROWS])
def test_each_row(rule: Rule, case: Evidence) -> None:
    decision = judge(case)
    assert decision.rule == rule.value
    assert decision.restart is next(row.restart for row in TABLE if row.rule is rule)
    assert decision.reason


# --- the variants within a row --------------------------------------------------------


@pytest.mark.parametrize(
    "health",
    [
        Probe(Reply.FAILED, status=500),
        Probe(Reply.TIMED_OUT, detail="no answer within 2s"),
        Probe(Reply.REFUSED, detail="connection refused"),
        Probe(Reply.BROKEN, detail="reset"),
        NOT_RUN_DECIDED,
    ],
    ids=["status", "timed_out", "refused", "broken", "not_run"],
)
def test_health_not_200_restarts(health: Probe) -> None:
    decision = judge(evidence(health=health, canary=canary(Reply.OK, 200)))
    assert (decision.rule, decision.restart) == ("health_failed", True)


@pytest.mark.parametrize("status", [200, 201, 299])
def test_any_2xx_canary_is_ok(status: int) -> None:
    assert judge(evidence(canary=canary(Reply.OK, status))).rule == "canary_ok"


@pytest.mark.parametrize("status", [400, 401, 404, 413, 422, 302])
def test_a_canary_refused_for_its_own_sake_shows_the_backend_serves(status: int) -> None:
    decision = judge(evidence(canary=canary(Reply.FAILED, status)))
    assert (decision.rule, decision.restart) == ("canary_answered", False)


@pytest.mark.parametrize("status", [500, 502, 503, 599])
def test_every_5xx_canary_restarts(status: int) -> None:
    decision = judge(evidence(canary=canary(Reply.FAILED, status), **BUSY_CPU))
    assert (decision.rule, decision.restart) == ("canary_5xx", True)


def test_408_canary_counts_as_unanswered() -> None:
    assert judge(evidence(canary=canary(Reply.FAILED, 408))).rule == "canary_unanswered_idle"
    busy = evidence(canary=canary(Reply.FAILED, 408), **BUSY_CPU)
    assert judge(busy).rule == "canary_unanswered_progressing"


@pytest.mark.parametrize("reply", [Reply.TIMED_OUT, Reply.REFUSED, Reply.BROKEN])
def test_unanswered_canary_decided_by_progress(reply: Reply) -> None:
    assert judge(evidence(canary=canary(reply))).restart is True
    assert judge(evidence(canary=canary(reply), **BUSY_CPU)).restart is False
    moving = Slots(total=2, busy=1, busy_after=2, progressed=True)
    assert judge(evidence(canary=canary(reply), slots=moving)).restart is False


def test_all_busy_progress_by_cpu_alone() -> None:
    decision = judge(evidence(slots=ALL_BUSY_STILL, canary=NO_FREE_SLOT, **BUSY_CPU))
    assert (decision.rule, decision.restart) == ("busy_progressing", False)


def test_all_busy_without_a_second_sample_needs_cpu() -> None:
    one_sample = Slots(total=1, busy=1)
    assert judge(evidence(slots=one_sample, canary=NO_FREE_SLOT)).rule == "busy_wedged"
    busy = evidence(slots=one_sample, canary=NO_FREE_SLOT, **BUSY_CPU)
    assert judge(busy).rule == "busy_progressing"


def test_saturated_with_a_free_slot_restarts_even_while_progressing() -> None:
    moving = Slots(total=2, busy=1, busy_after=1, progressed=True)
    decision = judge(evidence(slots=moving, canary=canary(Reply.FAILED, 429), **BUSY_CPU))
    assert (decision.rule, decision.restart) == ("saturated_with_free_slot", True)


def test_saturated_when_the_free_slot_was_taken_meanwhile() -> None:
    taken = Slots(total=2, busy=1, busy_after=2, progressed=True)
    decision = judge(evidence(slots=taken, canary=canary(Reply.FAILED, 429)))
    assert (decision.rule, decision.restart) == ("saturated_progressing", False)
    still = Slots(total=2, busy=1, busy_after=2, progressed=False)
    assert judge(evidence(slots=still, canary=canary(Reply.FAILED, 429))).restart is True


def test_no_canary_for_lack_of_time_is_decided_by_progress() -> None:
    spent = Probe(Reply.NOT_RUN, not_run=NotRun.NO_BUDGET)
    assert judge(evidence(canary=spent)).rule == "no_canary_idle"
    assert judge(evidence(canary=spent, **BUSY_CPU)).rule == "no_canary_progressing"


# --- CPU: what counts as advancing ----------------------------------------------------


@pytest.mark.parametrize(
    ("delta", "window", "advancing"),
    [
        (None, 1.0, False),
        (0.0, 1.0, False),
        (0.01, 1.0, False),  # one tick: an idle server answering our probes
        (0.049, 1.0, False),
        (0.05, 1.0, True),
        (0.02, 0.1, True),  # two ticks in a short window
        (0.019, 0.1, False),
        (1.0, 0.0, False),  # no window, no rate
        (4.0, 1.0, True),  # several cores
    ],
)
def test_cpu_advancing(delta: float | None, window: float, advancing: bool) -> None:
    case = evidence(cpu_seconds_delta=delta, window_seconds=window)
    assert case.cpu_advancing is advancing


def test_unknown_evidence_is_never_progress() -> None:
    case = evidence(cpu_seconds_delta=None, slots=Slots(total=1, busy=1), canary=NO_FREE_SLOT)
    assert case.progressing is False
    assert judge(case).restart is True


# --- the order of the rows ------------------------------------------------------------


def test_a_dead_process_wins_over_a_good_canary() -> None:
    for status, rule in [
        (ProcessStatus.GONE, "process_gone"),
        (ProcessStatus.ZOMBIE, "process_zombie"),
        (ProcessStatus.STOPPED, "process_stopped"),
    ]:
        case = evidence(process=status, canary=canary(Reply.OK, 200), **BUSY_CPU)
        assert judge(case).rule == rule


def test_failed_health_wins_over_a_good_canary_and_progress() -> None:
    case = evidence(
        health=Probe(Reply.TIMED_OUT), canary=canary(Reply.OK, 200), slots=ALL_BUSY_MOVING
    )
    assert judge(case).rule == "health_failed"


def test_a_good_canary_wins_over_wedged_slots() -> None:
    case = evidence(slots=ALL_BUSY_STILL, canary=canary(Reply.OK, 200))
    assert judge(case).rule == "canary_ok"


def test_busy_slots_win_over_a_5xx_canary() -> None:
    case = evidence(slots=ALL_BUSY_MOVING, canary=canary(Reply.FAILED, 500))
    assert judge(case).rule == "busy_progressing"


def test_a_5xx_canary_wins_over_progress() -> None:
    case = evidence(slots=FREE, canary=canary(Reply.FAILED, 503), **BUSY_CPU)
    assert judge(case).rule == "canary_5xx"


def test_rows_are_numbered_in_the_order_judge_tries_them() -> None:
    ids = [row.rule.value for row in TABLE]
    assert len(ids) == len(set(ids)) == len(Rule)
    assert ids.index("canary_ok") < ids.index("busy_wedged") < ids.index("canary_5xx")


# --- renderings -----------------------------------------------------------------------


def test_evidence_fields_are_json() -> None:
    case = Evidence(
        process=ProcessStatus.RUNNING,
        cpu_seconds_delta=0.123456,
        window_seconds=1.5,
        health=HEALTHY,
        slots=Slots(total=2, busy=2, busy_after=1, progressed=True),
        slots_note="",
        canary=NO_FREE_SLOT,
        seconds=1.75,
    )
    fields = case.to_fields()
    assert json.loads(json.dumps(fields)) == {
        "process": "running",
        "cpu_seconds_delta": 0.123,
        "window_seconds": 1.5,
        "health": {"reply": "ok", "status": 200},
        "slots": {"total": 2, "busy": 2, "busy_after": 1, "progressed": True},
        "canary": {"reply": "not_run", "not_run": "no_free_slot"},
        "seconds": 1.75,
    }


def test_evidence_fields_leave_out_the_unknown() -> None:
    fields = Evidence(process=ProcessStatus.GONE).to_fields()
    assert fields == {
        "process": "gone",
        "health": {"reply": "not_run", "not_run": "decided"},
        "canary": {"reply": "not_run", "not_run": "decided"},
        "seconds": 0.0,
    }
    noted = evidence(slots_note="/slots answered 501", canary=Probe(Reply.TIMED_OUT, detail="x"))
    assert noted.to_fields()["slots_note"] == "/slots answered 501"
    assert noted.to_fields()["canary"] == {"reply": "timed_out", "detail": "x"}


def test_markdown_table_has_every_row_in_order() -> None:
    lines = table_markdown().splitlines()
    assert lines[0] == "| # | Evidence | Decision | `rule` |"
    assert len(lines) == 2 + len(TABLE)
    assert lines[2].startswith("| 1 | ") and lines[2].endswith("| restart | `process_gone` |")
    assert lines[-1].endswith("| restart | `no_canary_idle` |")


def test_watchdog_page_carries_the_table() -> None:
    assert table_markdown() in WATCHDOG_PAGE.read_text(encoding="utf-8")
