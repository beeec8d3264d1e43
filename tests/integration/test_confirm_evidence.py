"""Confirmation's evidence from a real process: evidence.gather with the real probes
(http1, psutil) against the fake backend, and judge's verdict on it."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator

import psutil
import pytest

from slm_server.supervise.core.confirm import (
    Decision,
    Evidence,
    NotRun,
    ProcessStatus,
    Reply,
    judge,
)
from slm_server.supervise.shell.evidence import MonotonicClock, Target, gather
from slm_server.supervise.shell.probes import Http1Probe, PsutilProbe
from tests.fakes.control import FakeBackend
from tests.processes import poll

BUDGET = 3.0


@pytest.fixture
def fake() -> Iterator[FakeBackend]:
    with FakeBackend.start(model_id="confirm-model") as backend:
        yield backend


def confirm(
    fake: FakeBackend, *, has_slots: bool = False, create_time: float | None = None
) -> tuple[Evidence, Decision]:
    created = psutil.Process(fake.pid).create_time() if create_time is None else create_time
    target = Target(
        pid=fake.pid,
        create_time=created,
        model_id=fake.model_id,
        model_type="lm",
        has_slots=has_slots,
    )

    async def scenario() -> Evidence:
        http = Http1Probe(fake.url)
        try:
            return await gather(target, http, PsutilProbe(), BUDGET, MonotonicClock())
        finally:
            http.close()

    evidence = asyncio.run(scenario())
    assert evidence.seconds <= BUDGET + 0.5
    return evidence, judge(evidence)


def test_a_healthy_backend_is_not_confirmed(fake: FakeBackend) -> None:
    evidence, decision = confirm(fake)
    assert evidence.health.status == 200
    assert (evidence.canary.reply, evidence.canary.status) == (Reply.OK, 200)
    assert (decision.rule, decision.restart) == ("canary_ok", False)
    [canary] = fake.requests()
    assert canary["body"]["max_tokens"] == 1


def test_sigstopped_backend_is_stopped(fake: FakeBackend) -> None:
    fake.kill(signal.SIGSTOP)
    try:
        stopped = psutil.STATUS_STOPPED
        poll(lambda: psutil.Process(fake.pid).status() == stopped, 5, "the fake to stop")
        evidence, decision = confirm(fake)
    finally:
        fake.kill(signal.SIGCONT)
    assert evidence.process is ProcessStatus.STOPPED
    assert (decision.rule, decision.restart) == ("process_stopped", True)
    assert evidence.seconds < 0.5


def test_killed_backend_is_gone(fake: FakeBackend) -> None:
    created = psutil.Process(fake.pid).create_time()
    fake.kill()
    fake.wait_for_exit()
    evidence, decision = confirm(fake, create_time=created)
    assert evidence.process is ProcessStatus.GONE
    assert decision.rule == "process_gone"


def test_completions_500_fail_the_canary(fake: FakeBackend) -> None:
    fake.script(status=500)
    evidence, decision = confirm(fake)
    assert (evidence.canary.reply, evidence.canary.status) == (Reply.FAILED, 500)
    assert (decision.rule, decision.restart) == ("canary_5xx", True)


def test_500s_for_one_kind_of_request_only_are_not_confirmed(fake: FakeBackend) -> None:
    fake.script(status=500, body_contains='"tools"')
    _, decision = confirm(fake)
    assert (decision.rule, decision.restart) == ("canary_ok", False)


def test_health_ok_but_completions_stall(fake: FakeBackend) -> None:
    fake.script(stall=True)
    evidence, decision = confirm(fake)
    assert evidence.health.reply is Reply.OK
    assert evidence.canary.reply is Reply.TIMED_OUT
    assert evidence.cpu_seconds_delta is not None
    assert not evidence.cpu_advancing
    assert (decision.rule, decision.restart) == ("canary_unanswered_idle", True)


def test_health_that_hangs(fake: FakeBackend) -> None:
    fake.script(health_stall=True)
    evidence, decision = confirm(fake)
    assert evidence.health.reply is Reply.TIMED_OUT
    assert (decision.rule, decision.restart) == ("health_failed", True)


def test_busy_slots_progressing_are_not_confirmed(fake: FakeBackend) -> None:
    fake.script(slots=2, busy_slots=2, status=429)
    evidence, decision = confirm(fake, has_slots=True)
    assert evidence.canary.not_run is NotRun.NO_FREE_SLOT
    assert evidence.slots is not None and evidence.slots.progressed is True
    assert (decision.rule, decision.restart) == ("busy_progressing", False)
    assert fake.requests() == []  # no canary was sent


def test_a_reused_pid_is_gone(fake: FakeBackend) -> None:
    created = psutil.Process(fake.pid).create_time()
    evidence, decision = confirm(fake, create_time=created - 60)
    assert (evidence.process, decision.rule) == (ProcessStatus.GONE, "process_gone")


def test_busy_slots_frozen_are_wedged(fake: FakeBackend) -> None:
    fake.script(slots=1, busy_slots=1, slots_progress=False)
    evidence, decision = confirm(fake, has_slots=True)
    assert evidence.slots is not None and evidence.slots.progressed is False
    assert (decision.rule, decision.restart) == ("busy_wedged", True)


def test_429_with_a_free_slot_is_confirmed(fake: FakeBackend) -> None:
    fake.script(slots=2, busy_slots=1, status=429)
    evidence, decision = confirm(fake, has_slots=True)
    assert evidence.canary.status == 429
    assert (decision.rule, decision.restart) == ("saturated_with_free_slot", True)
