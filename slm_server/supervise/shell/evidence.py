"""Gathering a backend's :class:`~slm_server.supervise.core.confirm.Evidence`, within a
time budget. All I/O goes through two injected objects, an :class:`HttpProbe` and a
:class:`ProcessProbe` (real ones in ``probes.py``), and time through a :class:`Clock`.

The steps, each bounded by what is left of the budget:

1. process status: stopped, zombie or gone ends the gathering (rules 1-3 decide);
2. CPU time, first sample;
3. ``GET /health`` (at most ``HEALTH_TIMEOUT``): anything but 200 ends it (rule 4);
4. ``GET /slots``, first sample (backends with llama-server's ``/slots`` only);
5. a one-token canary, when a slot is free or slots are unknown and the model type has
   one (chat for ``lm``/``multimodal``, embeddings, rerank), given ``CANARY_SHARE`` of
   what is left; a 2xx ends it (rule 5);
6. the sampling window: wait until at least ``MIN_WINDOW`` (``BUSY_WINDOW_SHARE`` of
   the budget when every slot is busy) has passed since step 2;
7. ``GET /slots``, second sample; CPU time, second sample; process status again (a
   process that died or stopped meanwhile says more than anything else).

A step the budget leaves no time for is recorded as timed out (``/health``), not run
(the canary, ``NotRun.NO_BUDGET``) or unknown (slots, with a note). The budget is
measured on the injected clock and enforced on the event loop's timer, so a probe that
ignores its timeout cannot hold the gathering up.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Final, Protocol

from slm_server.contracts import engine_paths
from slm_server.supervise.core.confirm import (
    NOT_RUN_DECIDED,
    Evidence,
    NotRun,
    Probe,
    ProcessStatus,
    Reply,
)
from slm_server.supervise.core.slots_evidence import SlotSample, parse_slots, summarize

HEALTH_TIMEOUT: Final = 2.0
SLOTS_TIMEOUT: Final = 2.0
MIN_WINDOW: Final = 1.0
BUSY_WINDOW_SHARE: Final = 0.5
CANARY_SHARE: Final = 0.8
# The event loop's own deadline on a probe lies this far past the probe's timeout.
TIMER_SLACK: Final = 0.25
CANARY_TEXT: Final = "ok"


class ProbeError(Exception):
    """A probe got no answer. ``reply`` is ``Reply.TIMED_OUT`` (no connection or no
    answer in time), ``Reply.REFUSED`` (connection refused) or ``Reply.BROKEN`` (the
    connection broke or the answer was not HTTP)."""

    def __init__(self, reply: Reply, detail: str) -> None:
        super().__init__(detail)
        self.reply = reply
        self.detail = detail


class HttpProbe(Protocol):
    """HTTP to one backend. Both methods return (status, body) with the body cut at a
    bound, and raise :class:`ProbeError` when there is no answer within ``timeout``."""

    async def get(self, path: str, timeout: float) -> tuple[int, bytes]: ...

    async def post_json(
        self, path: str, payload: Mapping[str, object], timeout: float
    ) -> tuple[int, bytes]: ...


class ProcessProbe(Protocol):
    """The OS's view of a process; a pid whose creation time is not ``create_time``
    (None: not checked) is another process, so GONE."""

    def status(self, pid: int, create_time: float | None) -> ProcessStatus: ...

    def cpu_seconds(self, pid: int, create_time: float | None) -> float | None:
        """User+system CPU seconds of the process and its children; None if unknown."""
        ...


class Clock(Protocol):
    def now(self) -> float:
        """Monotonic seconds."""
        ...

    async def sleep(self, seconds: float) -> None: ...


class MonotonicClock:
    """The real clock: ``time.monotonic`` and ``asyncio.sleep``."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


@dataclass(frozen=True)
class Target:
    """The backend to confirm: its process, model and endpoints. ``has_slots``: it is
    the native llama-server, which has ``/slots`` (the Python fallback and the MLX
    servers have none)."""

    pid: int
    create_time: float | None
    model_id: str
    model_type: str
    has_slots: bool
    health_path: str = "/health"


def canary_request(model_type: str, model_id: str) -> tuple[str, dict[str, object]] | None:
    """The one-token request that shows a ``model_type`` backend can serve: (path,
    JSON body), or None when there is none (image and audio models)."""
    if model_type in ("lm", "multimodal"):
        message = {"role": "user", "content": CANARY_TEXT}
        payload = {"model": model_id, "messages": [message], "max_tokens": 1, "stream": False}
        return engine_paths.CHAT, payload
    if model_type == "completion":  # not a registry type today; kept for raw LMs
        return engine_paths.COMPLETIONS, {"model": model_id, "prompt": CANARY_TEXT, "max_tokens": 1}
    if model_type == "embeddings":
        return engine_paths.EMBEDDINGS, {"model": model_id, "input": CANARY_TEXT}
    if model_type == "rerank":
        payload = {"model": model_id, "query": CANARY_TEXT, "documents": [CANARY_TEXT]}
        return engine_paths.RERANK, payload
    return None


class _Budget:
    def __init__(self, clock: Clock, seconds: float) -> None:
        self.clock, self.seconds, self.start = clock, seconds, clock.now()

    def elapsed(self) -> float:
        return self.clock.now() - self.start

    def left(self) -> float:
        return max(0.0, self.seconds - self.elapsed())


async def _call(
    http: HttpProbe, path: str, timeout: float, payload: Mapping[str, object] | None = None
) -> tuple[int, bytes] | ProbeError:
    """One probe, never longer than ``timeout`` (plus slack) on the loop's timer."""
    if timeout <= 0:
        return ProbeError(Reply.TIMED_OUT, "no time left")
    call = http.get(path, timeout) if payload is None else http.post_json(path, payload, timeout)
    try:
        async with asyncio.timeout(timeout + TIMER_SLACK):
            return await call
    except ProbeError as exc:
        return exc
    except TimeoutError:
        return ProbeError(Reply.TIMED_OUT, f"no answer within {timeout:.3g}s")


async def _slots_sample(
    http: HttpProbe, timeout: float
) -> tuple[tuple[SlotSample, ...] | None, str]:
    """The slots, or None and why not."""
    answer = await _call(http, "/slots", timeout)
    if isinstance(answer, ProbeError):
        return None, f"/slots {answer.reply.value.replace('_', ' ')}: {answer.detail}"
    status, body = answer
    if status != 200:
        return None, f"/slots answered {status}"
    try:
        return parse_slots(body), ""
    except ValueError as exc:
        return None, str(exc)


def _probe(answer: tuple[int, bytes] | ProbeError, ok: bool) -> Probe:
    if isinstance(answer, ProbeError):
        return Probe(answer.reply, detail=answer.detail)
    return Probe(Reply.OK if ok else Reply.FAILED, status=answer[0])


async def gather(
    target: Target,
    http: HttpProbe,
    procs: ProcessProbe,
    budget_seconds: float,
    clock: Clock,
) -> Evidence:
    """The evidence about ``target``, gathered within ``budget_seconds`` (see the
    module docstring for the steps). Never raises for the backend's behaviour."""
    budget = _Budget(clock, budget_seconds)
    pid, created = target.pid, target.create_time
    process = procs.status(pid, created)
    if process is not ProcessStatus.RUNNING:
        return Evidence(process=process, seconds=budget.elapsed())
    cpu_before, window_start = procs.cpu_seconds(pid, created), clock.now()

    answer = await _call(http, target.health_path, min(HEALTH_TIMEOUT, budget.left()))
    health = _probe(answer, not isinstance(answer, ProbeError) and answer[0] == 200)
    evidence = Evidence(process=process, health=health)
    if health.reply is not Reply.OK:
        return _finish(evidence, target, procs, budget, cpu_before, window_start)

    first: tuple[SlotSample, ...] | None = None
    if target.has_slots:
        first, note = await _slots_sample(http, min(SLOTS_TIMEOUT, budget.left()))
        evidence = replace(evidence, slots_note=note)
    else:
        evidence = replace(evidence, slots_note="no /slots")
    all_busy = first is not None and summarize(first, None).all_busy
    request = canary_request(target.model_type, target.model_id)
    if all_busy:
        canary = Probe(Reply.NOT_RUN, not_run=NotRun.NO_FREE_SLOT)
    elif request is None:
        canary = Probe(Reply.NOT_RUN, not_run=NotRun.UNSUPPORTED)
    elif budget.left() <= 0:
        canary = Probe(Reply.NOT_RUN, not_run=NotRun.NO_BUDGET)
    else:
        path, payload = request
        answer = await _call(http, path, budget.left() * CANARY_SHARE, payload)
        canary = _probe(answer, not isinstance(answer, ProbeError) and 200 <= answer[0] < 300)
    evidence = replace(evidence, canary=canary)
    if first is not None:
        evidence = replace(evidence, slots=summarize(first, None))
    if canary.reply is Reply.OK:
        return _finish(evidence, target, procs, budget, cpu_before, window_start)

    window = max(MIN_WINDOW, BUSY_WINDOW_SHARE * budget_seconds) if all_busy else MIN_WINDOW
    reserve = min(SLOTS_TIMEOUT, budget.left() / 2) if first is not None else 0.0
    wait = min(window_start + window - clock.now(), budget.left() - reserve)
    if wait > 0:
        await clock.sleep(wait)
    if first is not None:
        second, note = await _slots_sample(http, min(SLOTS_TIMEOUT, budget.left()))
        evidence = replace(evidence, slots=summarize(first, second), slots_note=note)
    return _finish(evidence, target, procs, budget, cpu_before, window_start)


def _finish(
    evidence: Evidence,
    target: Target,
    procs: ProcessProbe,
    budget: _Budget,
    cpu_before: float | None,
    window_start: float,
) -> Evidence:
    """The second CPU sample and the last look at the process."""
    cpu_after = procs.cpu_seconds(target.pid, target.create_time)
    delta = None
    if cpu_before is not None and cpu_after is not None:
        delta = max(0.0, cpu_after - cpu_before)
    return replace(
        evidence,
        process=procs.status(target.pid, target.create_time),
        cpu_seconds_delta=delta,
        window_seconds=budget.clock.now() - window_start,
        seconds=budget.elapsed(),
    )


async def gather_remote(
    http: HttpProbe,
    model_type: str,
    model: str,
    prefix: str,
    budget_seconds: float,
    clock: Clock,
) -> tuple[Probe, Probe]:
    """A remote's model list (``GET {prefix}/v1/models``) and, when it answers, a
    one-token canary naming ``model``, within ``budget_seconds``: the evidence
    :func:`slm_server.supervise.core.eject.judge` decides on. ``http`` carries the key."""
    budget = _Budget(clock, budget_seconds)
    answer = await _call(http, f"{prefix}/v1/models", min(HEALTH_TIMEOUT, budget.left()))
    models = _probe(answer, not isinstance(answer, ProbeError) and 200 <= answer[0] < 300)
    if models.reply is not Reply.OK:
        return models, NOT_RUN_DECIDED
    request = canary_request(model_type, model)
    if request is None:
        return models, Probe(Reply.NOT_RUN, not_run=NotRun.UNSUPPORTED)
    if budget.left() <= 0:
        return models, Probe(Reply.NOT_RUN, not_run=NotRun.NO_BUDGET)
    path, payload = request
    answer = await _call(http, prefix + path, budget.left(), payload)
    return models, _probe(answer, not isinstance(answer, ProbeError) and 200 <= answer[0] < 300)
