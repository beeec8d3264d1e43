"""Gathering evidence with fake probes and a fake clock: every branch, no I/O."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from slm_server.supervise.core.confirm import Evidence, NotRun, ProcessStatus, Reply, Slots, judge
from slm_server.supervise.shell.evidence import (
    CANARY_SHARE,
    HEALTH_TIMEOUT,
    MIN_WINDOW,
    ProbeError,
    Target,
    canary_request,
    gather,
)

CHAT = "/v1/chat/completions"


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.t += seconds
        await asyncio.sleep(0)


TIMEOUT = "timeout"  # advances the fake clock by the timeout, then raises
REFUSED = "refused"
HANG = "hang"  # never answers: only the loop's own timer ends it


@dataclass
class FakeHttp:
    """Scripted answers by path: (status, body), TIMEOUT, REFUSED or HANG; a list is
    a queue (its last item repeats). ``cost`` seconds pass on every answer."""

    clock: FakeClock
    answers: dict[str, Any]
    cost: float = 0.01
    calls: list[tuple[str, float, Mapping[str, object] | None]] = field(default_factory=list)

    async def get(self, path: str, timeout: float) -> tuple[int, bytes]:
        return await self._answer(path, timeout, None)

    async def post_json(
        self, path: str, payload: Mapping[str, object], timeout: float
    ) -> tuple[int, bytes]:
        return await self._answer(path, timeout, payload)

    async def _answer(
        self, path: str, timeout: float, payload: Mapping[str, object] | None
    ) -> tuple[int, bytes]:
        self.calls.append((path, timeout, payload))
        script = self.answers[path]
        answer = (
            (script.pop(0) if len(script) > 1 else script[0])
            if isinstance(script, list)
            else script
        )
        if answer == TIMEOUT:
            self.clock.t += timeout
            raise ProbeError(Reply.TIMED_OUT, f"no answer within {timeout}s")
        if answer == REFUSED:
            raise ProbeError(Reply.REFUSED, "connection refused")
        if answer == HANG:
            await asyncio.Event().wait()
        self.clock.t += self.cost
        status, body = answer
        return status, body

    def paths(self) -> list[str]:
        return [path for path, _, _ in self.calls]


@dataclass
class FakeProcs:
    statuses: list[ProcessStatus] = field(default_factory=lambda: [ProcessStatus.RUNNING])
    cpu: list[float | None] = field(default_factory=lambda: [1.0])
    checked: list[tuple[int, float | None]] = field(default_factory=list)

    def status(self, pid: int, create_time: float | None) -> ProcessStatus:
        self.checked.append((pid, create_time))
        return self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]

    def cpu_seconds(self, pid: int, create_time: float | None) -> float | None:
        return self.cpu.pop(0) if len(self.cpu) > 1 else self.cpu[0]


def slots_body(*busy_decoded: tuple[bool, int]) -> tuple[int, bytes]:
    """A 200 /slots answer: one slot per (busy, n_decoded)."""
    return 200, json.dumps(
        [
            {
                "id": i,
                "is_processing": busy,
                "id_task": 7 + i,
                "n_prompt_tokens_processed": 4,
                "next_token": [{"n_decoded": decoded}],
            }
            for i, (busy, decoded) in enumerate(busy_decoded)
        ]
    ).encode()


OK = (200, b'{"status":"ok"}')
ANSWER = (200, b'{"choices":[]}')


def target(**fields: Any) -> Target:
    values: dict[str, Any] = {
        "pid": 4242,
        "create_time": 17.5,
        "model_id": "m1",
        "model_type": "lm",
        "has_slots": False,
    }
    values.update(fields)
    return Target(**values)


def run(
    answers: dict[str, Any],
    procs: FakeProcs | None = None,
    budget: float = 10.0,
    **target_fields: Any,
) -> tuple[Evidence, FakeHttp, FakeClock]:
    clock = FakeClock()
    http = FakeHttp(clock, answers)
    evidence = asyncio.run(
        gather(target(**target_fields), http, procs or FakeProcs(), budget, clock)
    )
    return evidence, http, clock


# --- the process first ------------------------------------------------------------------


@pytest.mark.parametrize(
    "status", [ProcessStatus.STOPPED, ProcessStatus.ZOMBIE, ProcessStatus.GONE]
)
def test_a_process_not_running_ends_it_at_once(status: ProcessStatus) -> None:
    procs = FakeProcs(statuses=[status])
    evidence, http, _ = run({}, procs)
    assert http.calls == []
    assert evidence.process is status
    assert evidence.seconds == 0.0
    assert evidence.canary.not_run is NotRun.DECIDED
    assert judge(evidence).restart is True
    assert procs.checked == [(4242, 17.5)]


def test_a_process_that_dies_during_confirmation_is_gone() -> None:
    procs = FakeProcs(statuses=[ProcessStatus.RUNNING, ProcessStatus.GONE])
    evidence, _, _ = run({"/health": OK, CHAT: ANSWER}, procs)
    assert evidence.process is ProcessStatus.GONE
    assert judge(evidence).rule == "process_gone"


# --- /health ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "reply"),
    [((503, b"loading"), Reply.FAILED), (TIMEOUT, Reply.TIMED_OUT), (REFUSED, Reply.REFUSED)],
)
def test_health_not_200_ends_it(answer: Any, reply: Reply) -> None:
    evidence, http, _ = run({"/health": answer, CHAT: ANSWER}, has_slots=True)
    assert http.paths() == ["/health"]
    assert evidence.health.reply is reply
    assert evidence.canary.not_run is NotRun.DECIDED
    assert judge(evidence).rule == "health_failed"


def test_health_has_a_short_timeout_of_its_own() -> None:
    evidence, http, _ = run({"/health": TIMEOUT})
    assert http.calls[0][1] == HEALTH_TIMEOUT
    assert evidence.seconds == pytest.approx(HEALTH_TIMEOUT)
    assert evidence.window_seconds == pytest.approx(HEALTH_TIMEOUT)


def test_health_path_is_the_targets() -> None:
    _, http, _ = run({"/v1/models": OK, CHAT: ANSWER}, health_path="/v1/models")
    assert http.paths()[0] == "/v1/models"


# --- the canary ---------------------------------------------------------------------------


def test_a_good_canary_ends_it_without_waiting_for_the_window() -> None:
    evidence, http, _ = run({"/health": OK, CHAT: ANSWER})
    assert http.paths() == ["/health", CHAT]
    assert http.calls[1][2] == {
        "model": "m1",
        "messages": [{"role": "user", "content": "ok"}],
        "max_tokens": 1,
        "stream": False,
    }
    assert evidence.canary.reply is Reply.OK and evidence.canary.status == 200
    assert evidence.seconds < MIN_WINDOW
    assert judge(evidence).rule == "canary_ok"


@pytest.mark.parametrize(
    ("answer", "reply", "rule"),
    [
        ((500, b"{}"), Reply.FAILED, "canary_5xx"),
        ((429, b"{}"), Reply.FAILED, "saturated_idle"),
        (TIMEOUT, Reply.TIMED_OUT, "canary_unanswered_idle"),
        (REFUSED, Reply.REFUSED, "canary_unanswered_idle"),
    ],
)
def test_a_failed_canary_then_samples_the_window(answer: Any, reply: Reply, rule: str) -> None:
    evidence, _, _ = run({"/health": OK, CHAT: answer}, FakeProcs(cpu=[5.0, 5.01]))
    assert evidence.canary.reply is reply
    assert evidence.window_seconds >= MIN_WINDOW
    assert evidence.cpu_seconds_delta == pytest.approx(0.01)
    assert judge(evidence).rule == rule


def test_a_timed_out_canary_with_cpu_advancing_is_not_confirmed() -> None:
    evidence, _, _ = run({"/health": OK, CHAT: TIMEOUT}, FakeProcs(cpu=[5.0, 12.0]))
    assert judge(evidence).rule == "canary_unanswered_progressing"


def test_the_canary_gets_a_share_of_what_is_left() -> None:
    _, http, _ = run({"/health": OK, CHAT: TIMEOUT}, budget=10.0)
    assert http.calls[1][1] == pytest.approx((10.0 - 0.01) * CANARY_SHARE)


@pytest.mark.parametrize(
    ("model_type", "path", "payload"),
    [
        ("multimodal", CHAT, {"max_tokens": 1}),
        ("completion", "/v1/completions", {"prompt": "ok", "max_tokens": 1}),
        ("embeddings", "/v1/embeddings", {"input": "ok"}),
        ("rerank", "/v1/rerank", {"query": "ok", "documents": ["ok"]}),
    ],
)
def test_canary_request_by_model_type(
    model_type: str, path: str, payload: dict[str, object]
) -> None:
    request = canary_request(model_type, "m1")
    assert request is not None
    assert request[0] == path
    assert request[1]["model"] == "m1"
    assert payload.items() <= request[1].items()


@pytest.mark.parametrize("model_type", ["image-generation", "image-edit", "whisper"])
def test_no_canary_for_media_models(model_type: str) -> None:
    assert canary_request(model_type, "m1") is None
    evidence, http, _ = run({"/health": OK}, FakeProcs(cpu=[1.0, 1.0]), model_type=model_type)
    assert http.paths() == ["/health"]
    assert evidence.canary.not_run is NotRun.UNSUPPORTED
    # Idle and answering /health: nothing tells a wedge from health, and the trip may
    # be a forged request file. Left alone.
    decision = judge(evidence)
    assert (decision.rule, decision.restart) == ("no_canary_for_type_idle", False)
    busy, _, _ = run({"/health": OK}, FakeProcs(cpu=[1.0, 3.0]), model_type=model_type)
    assert judge(busy).rule == "no_canary_progressing"


# --- /slots -------------------------------------------------------------------------------


def test_all_slots_busy_and_progressing_skips_the_canary() -> None:
    answers = {
        "/health": OK,
        "/slots": [slots_body((True, 3), (True, 9)), slots_body((True, 5), (True, 9))],
    }
    evidence, http, _ = run(answers, FakeProcs(cpu=[1.0, 1.0]), has_slots=True)
    assert http.paths() == ["/health", "/slots", "/slots"]
    assert evidence.canary.not_run is NotRun.NO_FREE_SLOT
    assert evidence.slots == Slots(total=2, busy=2, busy_after=2, progressed=True)
    assert evidence.window_seconds >= 5.0  # half the budget when every slot is busy
    assert evidence.seconds <= 10.0
    assert judge(evidence).rule == "busy_progressing"


def test_all_slots_busy_without_progress_is_wedged() -> None:
    body = slots_body((True, 3))
    evidence, _, _ = run({"/health": OK, "/slots": body}, FakeProcs(cpu=[1.0, 1.0]), has_slots=True)
    assert evidence.slots == Slots(total=1, busy=1, busy_after=1, progressed=False)
    assert judge(evidence).rule == "busy_wedged"


def test_a_free_slot_gets_a_canary() -> None:
    body = slots_body((True, 3), (False, 0))
    evidence, http, _ = run({"/health": OK, "/slots": body, CHAT: (429, b"{}")}, has_slots=True)
    assert http.paths() == ["/health", "/slots", CHAT, "/slots"]
    assert evidence.slots == Slots(total=2, busy=1, busy_after=1, progressed=False)
    assert judge(evidence).rule == "saturated_with_free_slot"


@pytest.mark.parametrize(
    ("answer", "note"),
    [
        ((501, b"{}"), "/slots answered 501"),
        ((200, b"not json"), "/slots is not JSON"),
        ((200, b"{}"), "/slots is not a JSON array"),
        (TIMEOUT, "/slots timed out"),
    ],
)
def test_unreadable_slots_count_as_unknown(answer: Any, note: str) -> None:
    evidence, http, _ = run({"/health": OK, "/slots": answer, CHAT: ANSWER}, has_slots=True)
    assert evidence.slots is None
    assert evidence.slots_note.startswith(note)
    assert CHAT in http.paths()
    assert judge(evidence).rule == "canary_ok"


def test_no_slots_are_asked_of_a_backend_without_them() -> None:
    evidence, http, _ = run({"/health": OK, CHAT: (500, b"")})
    assert "/slots" not in http.paths()
    assert evidence.slots_note == "no /slots"


# --- the budget ---------------------------------------------------------------------------


def test_the_budget_bounds_every_step() -> None:
    answers = {"/health": OK, "/slots": [slots_body((False, 0)), TIMEOUT], CHAT: TIMEOUT}
    evidence, http, _ = run(answers, budget=3.0, has_slots=True)
    assert evidence.seconds <= 3.0 + 1e-9
    assert all(timeout <= 3.0 for _, timeout, _ in http.calls)
    assert judge(evidence).rule == "canary_unanswered_idle"


def test_a_budget_spent_before_the_canary() -> None:
    answers = {"/health": OK, "/slots": TIMEOUT}
    evidence, http, _ = run(answers, budget=2.0, has_slots=True)
    assert evidence.health.reply is Reply.OK
    assert evidence.canary.not_run is NotRun.NO_BUDGET
    assert CHAT not in http.paths()
    assert evidence.seconds == pytest.approx(2.0)


def test_a_tiny_budget_times_health_out() -> None:
    evidence, http, _ = run({"/health": TIMEOUT}, budget=0.5)
    assert http.calls[0][1] == 0.5
    assert evidence.health.reply is Reply.TIMED_OUT


def test_a_probe_ignoring_its_timeout_is_cut_by_the_loop() -> None:
    async def scenario() -> Evidence:
        clock = FakeClock()
        http = FakeHttp(clock, {"/health": HANG})
        return await gather(target(), http, FakeProcs(), 0.02, clock)

    evidence = asyncio.run(asyncio.wait_for(scenario(), 5.0))
    assert evidence.health.reply is Reply.TIMED_OUT
    assert judge(evidence).rule == "health_failed"


def test_unknown_cpu_is_recorded_as_unknown() -> None:
    evidence, _, _ = run({"/health": OK, CHAT: TIMEOUT}, FakeProcs(cpu=[None]))
    assert evidence.cpu_seconds_delta is None
    assert judge(evidence).restart is True


def test_cpu_going_backwards_counts_as_none() -> None:
    evidence, _, _ = run({"/health": OK, CHAT: TIMEOUT}, FakeProcs(cpu=[5.0, 4.0]))
    assert evidence.cpu_seconds_delta == 0.0
