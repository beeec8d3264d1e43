"""Ejection of remotes on a fake clock: the base time, its doubling and cap, the
re-admission only after a healthy probe, and the verdicts (4xx never eject)."""

from __future__ import annotations

import pytest

from slm_server.supervise.core.confirm import NOT_RUN_DECIDED, NotRun, Probe, Reply
from slm_server.supervise.core.eject import Ejection, EjectionPolicy, Standing, judge

POLICY = EjectionPolicy(base_seconds=10.0, max_seconds=35.0, after=1)
OK = Probe(Reply.OK, status=200)


def answered(status: int) -> Probe:
    return Probe(Reply.OK if 200 <= status < 300 else Reply.FAILED, status=status)


def test_a_confirmed_trip_ejects_for_the_base_time() -> None:
    ejection = Ejection(POLICY)
    change = ejection.confirmed(100.0, "5xx")
    assert (change.event, change.seconds) == ("remote_ejected", 10.0)
    assert ejection.standing is Standing.EJECTED and ejection.until == 110.0
    assert ejection.reason == "5xx"


def test_no_probe_before_the_ejection_time_is_up() -> None:
    ejection = Ejection(POLICY)
    ejection.confirmed(100.0, "5xx")
    assert not ejection.due(109.999)
    assert ejection.due(110.0)


def test_readmitted_only_by_a_healthy_probe_after_the_time() -> None:
    ejection = Ejection(POLICY)
    ejection.confirmed(100.0, "5xx")
    assert ejection.ejected  # time alone re-admits nothing
    ejection.probing = True
    change = ejection.probed(110.0, healthy=True, reason="canary 200")
    assert change.event == "remote_readmitted"
    assert ejection.standing is Standing.ADMITTED and ejection.until is None


def test_a_failed_probe_ejects_again_for_twice_as_long_up_to_the_cap() -> None:
    ejection = Ejection(POLICY)
    ejection.confirmed(0.0, "timeout")
    lengths = []
    now = 10.0
    for _ in range(4):
        change = ejection.probed(now, healthy=False, reason="refused")
        assert change.event == "remote_ejected"
        lengths.append(change.seconds)
        assert ejection.until == now + change.seconds
        now = ejection.until
    assert lengths == [20.0, 35.0, 35.0, 35.0]
    assert ejection.reason == "re-admission probe failed: refused"


def test_a_repeated_ejection_after_readmission_doubles() -> None:
    ejection = Ejection(POLICY)
    ejection.confirmed(0.0, "5xx")
    ejection.probed(10.0, healthy=True, reason="ok")
    assert ejection.confirmed(11.0, "5xx").seconds == 20.0


def test_ejections_are_forgotten_after_max_seconds_admitted() -> None:
    ejection = Ejection(POLICY)
    ejection.confirmed(0.0, "5xx")
    ejection.probed(10.0, healthy=True, reason="ok")
    assert ejection.confirmed(10.0 + 35.0, "5xx").seconds == 10.0


def test_consecutive_confirmed_trips_eject_and_an_unconfirmed_one_breaks_the_run() -> None:
    ejection = Ejection(EjectionPolicy(10.0, 40.0, after=3))
    assert ejection.confirmed(0.0, "5xx").event is None
    assert ejection.confirmed(1.0, "5xx").event is None
    ejection.not_confirmed()
    assert ejection.confirmed(2.0, "5xx").event is None
    assert ejection.confirmed(3.0, "5xx").event is None
    assert ejection.confirmed(4.0, "5xx").event == "remote_ejected"


def test_a_trip_while_ejected_changes_nothing() -> None:
    ejection = Ejection(POLICY)
    ejection.confirmed(0.0, "5xx")
    assert ejection.confirmed(5.0, "5xx").event is None
    assert ejection.until == 10.0


def test_a_probe_answer_when_admitted_changes_nothing() -> None:
    ejection = Ejection(POLICY)
    assert ejection.probed(0.0, healthy=False, reason="late").event is None
    assert ejection.standing is Standing.ADMITTED


@pytest.mark.parametrize("status", [400, 401, 403, 404, 413, 422, 429])
def test_a_canary_4xx_never_ejects(status: int) -> None:
    decision = judge(OK, answered(status))
    assert not decision.restart
    assert decision.rule == "canary_answered"


@pytest.mark.parametrize("status", [401, 404])
def test_a_model_list_4xx_never_ejects(status: int) -> None:
    assert not judge(answered(status), OK).restart


@pytest.mark.parametrize(
    ("models", "canary", "rule"),
    [
        (answered(503), NOT_RUN_DECIDED, "remote_probe_failed"),
        (Probe(Reply.REFUSED, detail="refused"), NOT_RUN_DECIDED, "remote_probe_failed"),
        (Probe(Reply.TIMED_OUT), NOT_RUN_DECIDED, "remote_probe_failed"),
        (answered(408), NOT_RUN_DECIDED, "remote_probe_failed"),
        (OK, answered(500), "canary_5xx"),
        (OK, answered(408), "canary_unanswered"),
        (OK, Probe(Reply.TIMED_OUT, detail="no answer"), "canary_unanswered"),
        (OK, Probe(Reply.BROKEN, detail="reset"), "canary_unanswered"),
    ],
)
def test_what_ejects(models: Probe, canary: Probe, rule: str) -> None:
    decision = judge(models, canary)
    assert (decision.restart, decision.rule) == (True, rule)


def test_healthy_answers_do_not_eject() -> None:
    assert judge(OK, OK).rule == "canary_ok" and not judge(OK, OK).restart
    unsupported = Probe(Reply.NOT_RUN, not_run=NotRun.UNSUPPORTED)
    assert judge(OK, unsupported).rule == "remote_probe_answered"
    assert not judge(OK, unsupported).restart
