"""Talking to the backend for one call, under watch: every wait bounded by the call's
deadline, the client's presence and the drain; every outcome judged by the router's
half of the watchdog (the tripwire); every piece of the answer noted in the call's
:class:`~slm_server.router.watchdog.tripwire.Progress`, by which a deadline that cuts it is
judged."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Coroutine, Mapping
from typing import Any, TypeVar

from slm_server.contracts.verdicts import HEALTHY, classify_status, judged_answer, outcome_of
from slm_server.errors import BackendTimeout, GatewayError, ModelNotFound
from slm_server.registry.schema import ModelSpec
from slm_server.router.call.admission import Gate, Slot
from slm_server.router.call.admitted_call import Call, Deadline
from slm_server.router.call.exchange import QUEUED, Exchange
from slm_server.router.call.waits import ClientWatch, Waits
from slm_server.router.upstream.client import (
    Transport,
    UpstreamResponse,
    iter_bounded,
    read_all,
)
from slm_server.router.watchdog.tripwire import Progress, StallTimer, Tripwire

_T = TypeVar("_T")


class Sender:
    """Sends calls to backends and reads their answers, for one router."""

    def __init__(
        self,
        upstream: Transport,
        tripwire: Tripwire,
        gates: Mapping[str, Gate],
        max_answer: int,
    ) -> None:
        self.upstream = upstream
        self.tripwire = tripwire
        self.gates = gates
        self.max_answer = max_answer
        self.waits = Waits()

    async def admit(
        self, client: ClientWatch, spec: ModelSpec, exchange: Exchange, deadline: Deadline
    ) -> Slot:
        """Wait for an admission slot; the wait counts against the deadline, and a
        client that leaves while queued gives up its place at once."""
        gate = self.gates.get(spec.role)
        if gate is None:  # routed just before a reload removed its model
            raise ModelNotFound(
                f"The model '{spec.entry.id}' was removed from the registry by a reload",
                param="model",
            )
        started = time.perf_counter()
        try:
            # The gate enforces the deadline itself (a 504 never counted against the
            # backend); the guard's own limit is only a backstop behind it. A free slot
            # is taken at once, with nothing to guard.
            if not gate.try_acquire():
                exchange.enter(QUEUED)
                waiting = gate.acquire(deadline.remaining(), exchange.placed)
                await self._guard(client, waiting, deadline.at + 1.0, spec, deadline, None)
        finally:
            exchange.queue_seconds = time.perf_counter() - started
        return Slot(gate)

    def progress(self, call: Call) -> Progress | None:
        """A record of what the backend delivers, made as a request is sent: None when
        the deadline is not the backend's to answer for."""
        return Progress(time.perf_counter(), call.watch_progress) if call.judged else None

    def open(
        self,
        call: Call,
        path: str,
        body: bytes,
        progress: Progress | None,
        method: str = "POST",
    ) -> Coroutine[Any, Any, tuple[UpstreamResponse, StallTimer]]:
        """Send ``body`` to ``path`` (POST, or a raw request's ``method``) under the
        deadline; a stream gets its stall timer armed before sending, watching
        ``progress`` (or a record of its own, the timer's ``watch``, when the deadline
        is not judged). (A plain function returning the guarded work, to be awaited:
        one coroutine fewer per request.)"""
        return self.guard(call, self._open(call, path, body, progress, method), progress)

    async def _open(
        self, call: Call, path: str, body: bytes, progress: Progress | None, method: str
    ) -> tuple[UpstreamResponse, StallTimer]:
        spec, exchange = call.spec, call.exchange
        raw = exchange.shape is not None and exchange.shape.raw
        # A raw request's wait is the client's to answer for (an engine path that answers
        # only when its work is done, a slot the request asked for that is busy): no
        # stall timer.
        if (exchange.stream or call.gathered) and not raw:
            if progress is None:
                progress = Progress(time.perf_counter(), call.watch_progress)
            timer = self.tripwire.stall_timer(spec, progress)
        else:
            timer = StallTimer()
        started = time.perf_counter()
        try:
            return await self.upstream.open(spec, path, body, call.headers, method), timer
        except GatewayError as error:
            timer.cancel()
            self.tripwire.observe(spec, outcome_of(error), error.message)
            raise
        except BaseException:
            timer.cancel()
            raise
        finally:
            exchange.upstream_seconds += time.perf_counter() - started

    async def read(
        self, call: Call, upstream: UpstreamResponse, progress: Progress | None
    ) -> bytes:
        """The whole body under the deadline (at once when it is in already), with the
        outcome judged by the watchdog."""
        if upstream.complete:  # nothing to wait for
            return await self._read(call.spec, upstream, call.exchange, None)
        noted = progress if progress is not None else Progress(time.perf_counter())
        reading = self._read(call.spec, upstream, call.exchange, noted)
        return await self.guard(call, reading, progress)

    async def _read(
        self,
        spec: ModelSpec,
        upstream: UpstreamResponse,
        exchange: Exchange,
        progress: Progress | None,
    ) -> bytes:
        """The whole body; read piece by piece, each piece noted in ``progress``, when
        there is one."""
        started = time.perf_counter()
        try:
            if progress is None:
                content = await read_all(spec, upstream, self.max_answer)
            else:
                content = await self._gather(spec, upstream, progress)
        except GatewayError as error:
            self.tripwire.observe(spec, outcome_of(error), error.message)
            raise
        finally:
            exchange.upstream_seconds += time.perf_counter() - started
        shape = exchange.shape  # how its engine's statuses are judged
        judge = shape.statuses if shape is not None else classify_status
        self.tripwire.observe(spec, judged_answer(judge(upstream.status_code), content))
        return content

    async def _gather(
        self, spec: ModelSpec, upstream: UpstreamResponse, progress: Progress
    ) -> bytes:
        """The whole body, piece by piece as it arrives (the caller closes ``upstream``)."""
        parts: list[bytes] = []
        progress.waiting(time.perf_counter())
        async for part in iter_bounded(spec, upstream, self.max_answer):
            progress.arrived()
            parts.append(part)
            progress.waiting(time.perf_counter())
        return b"".join(parts)

    async def watched(
        self,
        call: Call,
        chunks: AsyncIterator[_T],
        timer: StallTimer,
        progress: Progress,
    ) -> AsyncIterator[_T]:
        """``chunks`` as they come, each noted in ``progress``; the first one clears the
        stall timer and counts as health, a transport failure counts against the
        backend."""
        spec, exchange = call.spec, call.exchange
        iterator = aiter(chunks)
        try:
            while True:
                started = time.perf_counter()
                # Left set when a cut cancels the wait: the deadline is judged after.
                progress.waiting(started)
                try:
                    chunk = await anext(iterator)
                except StopAsyncIteration:
                    return
                finally:
                    exchange.upstream_seconds += time.perf_counter() - started
                progress.arrived()
                if exchange.first_chunk is None:
                    timer.first_byte()
                    self.tripwire.observe(spec, HEALTHY)
                exchange.note_chunk()
                yield chunk
        except GatewayError as error:
            exchange.note_error(error)
            self.tripwire.observe(spec, outcome_of(error), error.message)
            raise
        finally:
            timer.cancel()

    def guard(
        self, call: Call, work: Awaitable[_T], progress: Progress | None
    ) -> Coroutine[Any, Any, _T]:
        """``work`` until the call's deadline, judged from ``progress`` if it cuts it (to
        be awaited)."""
        return self._guard(call.client, work, call.deadline.at, call.spec, call.deadline, progress)

    async def _guard(
        self,
        client: ClientWatch,
        work: Awaitable[_T],
        until: float,
        spec: ModelSpec,
        deadline: Deadline,
        progress: Progress | None,
    ) -> _T:
        """``work`` under the deadline (ending at loop time ``until``), the client's
        presence and the drain. A deadline that is the model's own is judged by the
        watchdog from ``progress``; None when the deadline is not the backend's to
        answer for (the caller shortened it, or the request is still queued)."""
        try:
            return await self.waits.run(client, work, until)
        except TimeoutError:
            error = BackendTimeout(
                f"The backend for '{spec.entry.id}' did not answer within the request's "
                f"deadline of {deadline.seconds:.3g}s",
                code="deadline_exceeded",
            )
            self.judge_deadline(spec, progress, error)
            raise error from None

    def judge_deadline(
        self, spec: ModelSpec, progress: Progress | None, error: GatewayError
    ) -> None:
        """Let the watchdog weigh a deadline that cut the call, by what was delivered."""
        if progress is not None:
            self.tripwire.deadline(spec, progress, time.perf_counter(), error.message)

    def cancel_waiting(self) -> None:
        """End every request still waiting on a backend (the drain period is over)."""
        self.waits.cancel_all()


__all__ = ["Sender"]
