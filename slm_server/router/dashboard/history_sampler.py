"""The dashboard's history, its shell: a task of the router's own
(:class:`~slm_server.router.call.periodic.Periodic`) that every
``SLM_HISTORY_INTERVAL_SECONDS`` takes a :class:`~.history.Snapshot` of the router
(:func:`snapshot`) and follows ``logs/watchdog.jsonl`` for lifecycle events.

A snapshot reads what the router keeps anyway, the same sources its other views read:
the running totals of :class:`~slm_server.router.observe.metrics.Metrics` (as
``/metrics`` shows them), the admission gates (as ``/v1/backends/health``'s
``in_flight`` and ``queued``), the models holding memory and the machine's free memory
(as ``/health``'s ``memory``), the supervisor's published states with the router's
failure streaks, the restart budgets, and the backends a reload retires. Nothing is
written per request. The log is looked at with one ``stat`` per turn and read, from
where the last turn left off, in a worker thread only when it changed
(:class:`~slm_server.router.dashboard.log_tail.Follower`).

The log never costs a sample. A turn waits for the log's read at most
``MAX_READ_WAIT_SECONDS`` (or the interval, when shorter) and takes its sample; a read
still under way goes on, its events going with a later sample, and no other is started
until it ends. A read that fails (an ``OSError`` of the file system) is logged, once a
minute at most while it fails the same way, and tried again at the next turn.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from slm_server.contracts.records import BackendState, budget_view
from slm_server.router.call.admission import Gate
from slm_server.router.call.backend_state import StateSource
from slm_server.router.call.periodic import Periodic
from slm_server.router.call.waits import cancel_and_wait
from slm_server.router.dashboard.history import (
    BackendReading,
    Buckets,
    History,
    ModelReading,
    Snapshot,
)
from slm_server.router.dashboard.log_tail import Follower
from slm_server.router.dashboard.timeline import Event, events_of, lane_of
from slm_server.router.dispatch.lookup import Registry
from slm_server.router.observe.metrics import Metrics
from slm_server.router.ondemand.memory_fit import Holder
from slm_server.router.ondemand.pressure_watch import PressureWatch

log = logging.getLogger("slm_server.router")

# Chunks of the log read in one turn at most (64 KiB each); the rest waits a turn.
MAX_READS_PER_TURN: Final = 16
# The longest a turn waits for the log's read before it takes its sample all the same.
MAX_READ_WAIT_SECONDS: Final = 1.0
# A read failing the same way is logged again after this long.
FAILURE_LOG_SECONDS: Final = 60.0


@dataclass(frozen=True)
class Sources:
    """Where a snapshot is read from (each read in place: a reload rewires them)."""

    registry: Registry
    metrics: Metrics
    gates: Mapping[str, Gate]
    states: StateSource
    failing: Callable[[str], int]  # the router's open failure streak on a role
    holders: Callable[[], Sequence[Holder]]  # the models holding memory now
    pressure: PressureWatch

    def buckets(self) -> Buckets:
        metrics = self.metrics
        return Buckets(
            metrics.first_token.bounds,
            metrics.tokens_per_second.bounds,
            metrics.queue_wait.bounds,
        )


def restart_budget(known: BackendState, wall: float) -> dict[str, Any]:
    """A backend's restart budget as the history answers it."""
    view = budget_view(known, wall)
    frees = None if view.frees_at is None else round(max(0.0, view.frees_at - wall), 1)
    return {
        "used": view.used,
        "limit": view.max_restarts,
        "left": 0 if view.abandoned else view.remaining,
        "frees_in_seconds": frees,
    }


def _models(sources: Sources, holders: Sequence[Holder]) -> dict[str, ModelReading]:
    """Every enabled model (an entry's replicas together), by id."""
    metrics = sources.metrics
    requests = metrics.requests.sums("model", "outcome")
    histograms = {
        "ttft": metrics.first_token,
        "tokens_per_second": metrics.tokens_per_second,
        "admission_wait": metrics.queue_wait,
    }
    buckets = {name: spread.buckets_by("model") for name, spread in histograms.items()}
    empty = {name: [0] * (len(spread.bounds) + 1) for name, spread in histograms.items()}
    prompt = metrics.prompt_tokens.sums("model")
    cached = metrics.cached_tokens.sums("model")
    held: dict[str, float] = {}
    for holder in holders:
        held[holder.model_id] = held.get(holder.model_id, 0.0) + holder.footprint_mb
    roles: dict[str, list[str]] = {}
    for spec in sources.registry.enabled:
        roles.setdefault(spec.entry.id, []).append(spec.role)
    models: dict[str, ModelReading] = {}
    for model, its_roles in roles.items():
        gates = [g for g in map(sources.gates.get, its_roles) if g is not None]
        models[model] = ModelReading(
            requests={o: n for (m, o), n in requests.items() if m == model},
            ttft=buckets["ttft"].get(model, empty["ttft"]),
            tokens_per_second=buckets["tokens_per_second"].get(model, empty["tokens_per_second"]),
            admission_wait=buckets["admission_wait"].get(model, empty["admission_wait"]),
            prompt_tokens=prompt.get((model,), 0.0),
            cached_tokens=cached.get((model,), 0.0),
            in_flight=sum(g.active for g in gates) if gates else None,
            queued=sum(g.queued for g in gates) if gates else None,
            memory_mb=held.get(model, 0.0),
        )
    return models


def _backends(sources: Sources, wall: float) -> dict[str, BackendReading]:
    """Every backend of the registry, and those a reload retires, by role."""
    states = sources.states
    supervised = states.launcher_alive()
    backends: dict[str, BackendReading] = {}
    for spec in sources.registry.models:
        entry = spec.entry
        if not entry.enabled:
            backends[spec.role] = BackendReading(entry.id, "disabled")
            continue
        known = states.get(spec.role, entry.port)
        lane = lane_of(
            known.state if known is not None else None,
            supervised=supervised,
            failing=sources.failing(spec.role) > 0,
        )
        budget = restart_budget(known, wall) if known is not None and not entry.remote else None
        backends[spec.role] = BackendReading(entry.id, lane, budget)
    for retiring in states.retiring():
        if retiring.role not in backends:
            backends[retiring.role] = BackendReading(retiring.model_id, "retired")
    return backends


def snapshot(sources: Sources, clock: float, wall: float) -> Snapshot:
    """The router now, as :class:`~.history.History` records it."""
    holders = sources.holders()
    pressure = sources.pressure
    machine: dict[str, float | None] = {
        "free_mb": pressure.free_mb,
        "floor_mb": pressure.floor.floor_mb,
        "budget_mb": pressure.budget_mb,
        "held_mb": sum(h.footprint_mb for h in holders),
    }
    return Snapshot(
        wall=wall,
        clock=clock,
        machine=machine,
        models=_models(sources, holders),
        backends=_backends(sources, wall),
    )


def _started(follower: Follower, count: int) -> list[Event]:
    """The lifecycle events among the log's last ``count`` lines (a worker thread's)."""
    return events_of(line.text for line in follower.start(count) if not line.cut)


def _polled(follower: Follower) -> list[Event]:
    """The lifecycle events appended since the last look (a worker thread's)."""
    return events_of(line.text for line in follower.poll() if not line.cut)


class HistorySampler:
    """Takes a snapshot every ``interval`` seconds into ``history`` and follows the
    watchdog log at ``events_path``; see the module docstring. ``wall`` is read at every
    sample (the restart budgets reckon by it); the history's times go on from the first
    by ``clock``."""

    def __init__(
        self,
        history: History,
        sources: Sources,
        events_path: Path,
        interval: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.history = history
        self.sources = sources
        self.events_path = events_path
        self.interval = interval
        self.clock = clock
        self.wall = wall
        self.follower: Follower | None = None
        self._reading: asyncio.Task[None] | None = None  # a read of the log under way
        self._failure: tuple[str, float] | None = None  # the last one logged, and when
        self._task = Periodic(
            self._turn,
            after_failure=lambda: self.interval,
            log=log,
            failure="the dashboard's history failed a sample",
        )

    def start(self) -> None:
        """Sample now, and then every ``interval`` seconds, on the current loop."""
        self._task.start()

    async def stop(self) -> None:
        await self._task.stop()
        reading, self._reading = self._reading, None
        await cancel_and_wait(reading)

    async def _turn(self) -> float:
        # The log is read just before the sample is taken, and its new events go with
        # that sample (``since`` answers them by it, not by their own times): a page
        # that asks for what is newer than its last sample gets each event once, even
        # one written before that sample but read only now (a turn that had more log to
        # read than it reads, a writer slow between its clock and its write).
        await self._read_log()
        clock, wall = self.clock(), self.wall()
        self.history.record(snapshot(self.sources, clock, wall))
        return self.interval

    async def _read_log(self) -> None:
        """The log followed, waited for at most ``MAX_READ_WAIT_SECONDS`` (see the
        module docstring)."""
        reading = self._reading
        if reading is None or reading.done():
            reading = self._reading = asyncio.get_running_loop().create_task(self._follow())
        await asyncio.wait({reading}, timeout=min(self.interval, MAX_READ_WAIT_SECONDS))

    async def _follow(self) -> None:
        """:meth:`follow`, its failure logged rather than raised."""
        try:
            await self.follow()
        except OSError as error:
            self._failed(f"{type(error).__name__}: {error}")
        except Exception as error:  # a bug: its traceback logged, the samples go on
            self._failed(repr(error), error)
        else:
            if self._failure is not None:
                self._failure = None
                log.info("the dashboard's history reads %s again", self.events_path)

    def _failed(self, what: str, error: Exception | None = None) -> None:
        """A failed read logged (``error``'s traceback with it when given), unless it
        failed the same way within the last ``FAILURE_LOG_SECONDS``."""
        now, last = self.clock(), self._failure
        if last is not None and last[0] == what and now - last[1] < FAILURE_LOG_SECONDS:
            return
        self._failure = (what, now)
        log.warning(
            "the dashboard's history could not read %s (%s); it samples on without it",
            self.events_path,
            what,
            exc_info=error,
        )

    async def follow(self) -> None:
        """The log's new lifecycle events into the history (at the first call, those
        among its last lines), noted together once all are read (or when a read fails,
        those read before it): they go with the next sample recorded, and no answer
        holds them before it is."""
        follower = self.follower
        if follower is None:
            follower = Follower(self.events_path)
            count = self.history.events.maxlen or 0
            self.history.note(await asyncio.to_thread(_started, follower, count))
            self.follower = follower
            return
        read: list[Event] = []
        try:
            for _ in range(MAX_READS_PER_TURN):
                if follower.unchanged():  # one stat: most turns end here
                    break
                read += await asyncio.to_thread(_polled, follower)
                if not follower.behind:
                    break
        finally:  # what was read before a read failed is not read again: noted
            self.history.note(read)


__all__ = ["HistorySampler", "Sources", "restart_budget", "snapshot"]
