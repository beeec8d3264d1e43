"""The dashboard's history, pure: what the router looked like at each of its last
samples, kept in fixed-size rings (:mod:`~slm_server.router.dashboard.rings`).

The sampler hands :meth:`History.record` one :class:`Snapshot` per tick: the running
totals the router keeps anyway (requests by outcome, the histograms of time to the
first token, decode speed and admission wait, prompt tokens and those read from the
cache) and what holds at that moment (requests in flight and queued, the memory each
model holds, the machine's free memory, each backend's lane state and restart budget).
Nothing is recorded per request: a series over an interval is the difference between
two snapshots' totals.

* ``requests_<group>``: requests per second in the interval, the outcomes grouped by
  :data:`GROUPS`.
* ``<histogram>_p50`` and ``_p95``: the quantile of the interval's observations, found
  as Prometheus' ``histogram_quantile`` finds it from the bucket counts' differences
  (:func:`quantile`); null when the interval had none.
* ``prompt_tokens_cached`` and ``prompt_tokens_computed``: tokens in the interval.
* ``in_flight``, ``queued``, ``memory_mb``: as sampled.

A sample's time is the first sample's wall clock plus the monotonic time elapsed since
(``Snapshot.clock``), so that ``times`` always strictly increase and ``since`` never
stalls, whatever the machine's clock does (stepped back by NTP, a resumed virtual
machine); a clock stepped later leaves them that much behind it.

A series is null at the first sample (no interval yet), for a model the previous
snapshot did not have, and wherever the snapshot had nothing to say. A model or a
backend that leaves the snapshots (a reload removed it) keeps its series, null from
then on, until its last sample leaves the rings. The last ``MAX_EVENTS`` lifecycle
events (:mod:`~slm_server.router.dashboard.timeline`) are kept beside the samples, each
going with the first sample recorded after it was noted: ``since`` answers an event
with its sample, not by its own time, which may be older than the sample before (the
log read a turn late), and never later than its sample's time (the log is read before
the sample is taken, so a later time is forged or the log's clock is ahead: it is
answered as its sample's). One answer holds at most ``MAX_ANSWER_SAMPLES`` samples, the
newest, and says so (``truncated``) when older ones were left out.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from slm_server.router.dashboard.rings import MISSING_STATE, Ring
from slm_server.router.dashboard.timeline import LANE_INDEX, LANES, Event

MAX_EVENTS: Final = 4096
# The most samples one answer holds (the newest; the page keeps no more than this):
# answering 18,000 (an hour at 0.2 s) would hold the event loop.
MAX_ANSWER_SAMPLES: Final = 4000
# Samples' times as answered: milliseconds.
TIME_DECIMALS: Final = 3
TIME_STEP: Final = 10.0**-TIME_DECIMALS
# The outcomes of ``slm_requests_total`` (observe.metrics.OUTCOMES), grouped.
GROUPS: Final = {
    "ok": ("ok",),
    "client_error": ("client_error", "rejected"),
    "backend_error": ("backend_error", "timeout", "unavailable", "router_error"),
    "cut": ("cancelled", "stream_error"),
}
HISTOGRAMS: Final = ("ttft", "tokens_per_second", "admission_wait")
SERIES: Final = (
    *(f"requests_{group}" for group in GROUPS),
    "ttft_p50",
    "ttft_p95",
    "tokens_per_second_p50",
    "tokens_per_second_p95",
    "in_flight",
    "queued",
    "admission_wait_p50",
    "admission_wait_p95",
    "memory_mb",
    "prompt_tokens_cached",
    "prompt_tokens_computed",
)
MACHINE: Final = ("free_mb", "floor_mb", "budget_mb", "held_mb")
NAN: Final = float("nan")
# Values are kept rounded, as answered: finer than any figure the page draws.
DECIMALS: Final = 4


@dataclass(frozen=True)
class ModelReading:
    """One model at one tick. ``requests`` (by outcome), the histograms' bucket counts
    (not cumulative, the ``+Inf`` bucket last) and the token counts are running totals;
    the rest holds at that moment (None: not known)."""

    requests: Mapping[str, float] = field(default_factory=dict)
    ttft: Sequence[int] = ()
    tokens_per_second: Sequence[int] = ()
    admission_wait: Sequence[int] = ()
    prompt_tokens: float = 0.0
    cached_tokens: float = 0.0
    in_flight: int | None = None
    queued: int | None = None
    memory_mb: float | None = None


@dataclass(frozen=True)
class BackendReading:
    """One backend at one tick: its model, its lane state (one of ``timeline.LANES``)
    and its restart budget as answered (None: not known)."""

    model: str
    lane: str
    budget: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Snapshot:
    """The router at one tick: ``wall`` seconds (the wall clock; the first sample's is
    where the answer's times start) and ``clock`` (monotonic, what rates and the times
    after the first are reckoned by)."""

    wall: float
    clock: float
    machine: Mapping[str, float | None] = field(default_factory=dict)  # MACHINE's keys
    models: Mapping[str, ModelReading] = field(default_factory=dict)
    backends: Mapping[str, BackendReading] = field(default_factory=dict)


@dataclass(frozen=True)
class Buckets:
    """The upper bounds (ascending, ``+Inf`` left out) of each histogram's buckets."""

    ttft: Sequence[float]
    tokens_per_second: Sequence[float]
    admission_wait: Sequence[float]


def quantile(q: float, bounds: Sequence[float], counts: Sequence[float]) -> float | None:
    """The ``q`` quantile of observations counted per bucket (``counts``, one more than
    ``bounds``: the ``+Inf`` bucket), by linear interpolation within the bucket it
    falls in, as Prometheus' ``histogram_quantile`` does: the first bucket starts at 0,
    and a quantile in the ``+Inf`` bucket is the highest finite bound. None without
    observations."""
    total = sum(counts)
    if total <= 0 or not bounds:
        return None
    rank = q * total
    below = 0.0
    for index, count in enumerate(counts):
        if below + count >= rank and count > 0:
            if index >= len(bounds):
                return float(bounds[-1])
            start = 0.0 if index == 0 else float(bounds[index - 1])
            return start + (float(bounds[index]) - start) * (rank - below) / count
        below += count
    return float(bounds[-1])


def _delta(now: Sequence[int], before: Sequence[int]) -> list[int] | None:
    """The bucket counts of an interval; None when the totals are not comparable. A
    total that went down (counted again from zero) counts from zero."""
    if len(now) != len(before) or not now:
        return None
    moved = [a - b for a, b in zip(now, before, strict=True)]
    return list(now) if any(m < 0 for m in moved) else moved


def _grouped(requests: Mapping[str, float]) -> dict[str, float]:
    return {g: sum(requests.get(o, 0.0) for o in outcomes) for g, outcomes in GROUPS.items()}


class _Lane:
    """One backend's lane states and its latest model and restart budget."""

    __slots__ = ("budget", "last_seen", "model", "states")

    def __init__(self, capacity: int, first: int, model: str) -> None:
        self.states = Ring("b", capacity, first)
        self.model = model
        self.budget: Mapping[str, Any] | None = None
        self.last_seen = first


class _Series:
    """One model's series, a ring each."""

    __slots__ = ("last_seen", "rings")

    def __init__(self, capacity: int, first: int) -> None:
        self.rings = {name: Ring("d", capacity, first) for name in SERIES}
        self.last_seen = first


class History:
    """The last ``capacity`` samples and the last ``MAX_EVENTS`` lifecycle events."""

    def __init__(self, capacity: int, buckets: Buckets, max_events: int = MAX_EVENTS) -> None:
        self.capacity = capacity
        self.buckets = buckets
        self.tick = 0  # the next sample's number
        self.times = Ring("d", capacity)
        self.machine = {name: Ring("d", capacity) for name in MACHINE}
        self.models: dict[str, _Series] = {}
        self.backends: dict[str, _Lane] = {}
        self.events: deque[Event] = deque(maxlen=max_events)
        # In step with ``events``: the tick of the sample each goes with, the first
        # recorded after it was noted, by which ``since`` answers it.
        self.noted_at: deque[int] = deque(maxlen=max_events)
        self._last: Snapshot | None = None
        self._start: tuple[float, float] | None = None  # the first sample's wall, clock
        self._last_time: float | None = None

    # -- writing ------------------------------------------------------------------

    def record(self, snapshot: Snapshot) -> None:
        """One tick: ``snapshot``'s values, and the intervals since the last one."""
        at = self._time_of(snapshot)
        self._clamp_events(self.tick, at)
        try:
            self._write(self.tick, at, snapshot)
        finally:
            # A sample that failed part-way keeps its tick (missing where not written):
            # the next one takes the tick after it rather than failing on it for ever.
            self.tick = self.times.end
        self._last = snapshot
        self._forget(self.tick - self.capacity)

    def _time_of(self, snapshot: Snapshot) -> float:
        """The sample's time, as answered (``since`` compares it): the first sample's
        wall clock plus the monotonic time since, later than the last sample's."""
        start = self._start
        if start is None:
            start = self._start = (snapshot.wall, snapshot.clock)
        at = round(start[0] + (snapshot.clock - start[1]), TIME_DECIMALS)
        last = self._last_time
        if last is not None and not at > last:  # a clock that did not move: a fake one
            at = round(last + TIME_STEP, TIME_DECIMALS)
        self._last_time = at
        return at

    def _clamp_events(self, tick: int, at: float) -> None:
        """The events going with the sample of ``tick`` (the last noted), none later
        than its time ``at``."""
        events, noted_at = self.events, self.noted_at
        index = len(events) - 1
        while index >= 0 and noted_at[index] == tick:
            if events[index].ts > at:
                events[index] = events[index]._replace(ts=at)
            index -= 1

    def _write(self, tick: int, at: float, snapshot: Snapshot) -> None:
        last = self._last
        self.times.put(tick, at)
        for name, ring in self.machine.items():
            value = snapshot.machine.get(name)
            ring.put(tick, NAN if value is None else round(value, DECIMALS))
        elapsed = snapshot.clock - last.clock if last is not None else 0.0
        for model, reading in snapshot.models.items():
            series = self.models.get(model)
            if series is None:
                series = self.models[model] = _Series(self.capacity, tick)
            before = last.models.get(model) if last is not None else None
            values = self._values(reading, before, elapsed)
            for name, ring in series.rings.items():
                ring.put(tick, round(values.get(name, NAN), DECIMALS))
            series.last_seen = tick
        for role, backend in snapshot.backends.items():
            lane = self.backends.get(role)
            if lane is None:
                lane = self.backends[role] = _Lane(self.capacity, tick, backend.model)
            lane.states.put(tick, LANE_INDEX.get(backend.lane, LANE_INDEX["unknown"]))
            lane.model, lane.budget, lane.last_seen = backend.model, backend.budget, tick

    def _values(
        self, now: ModelReading, before: ModelReading | None, elapsed: float
    ) -> dict[str, float]:
        """One model's values at a tick (those left out are null)."""
        values = {
            "in_flight": NAN if now.in_flight is None else float(now.in_flight),
            "queued": NAN if now.queued is None else float(now.queued),
            "memory_mb": NAN if now.memory_mb is None else now.memory_mb,
        }
        if before is None or elapsed <= 0:
            return values
        was, grouped = _grouped(before.requests), _grouped(now.requests)
        for group, total in grouped.items():
            values[f"requests_{group}"] = max(0.0, total - was[group]) / elapsed
        for name in HISTOGRAMS:
            moved = _delta(getattr(now, name), getattr(before, name))
            bounds = getattr(self.buckets, name)
            for q, suffix in ((0.5, "p50"), (0.95, "p95")):
                found = None if moved is None else quantile(q, bounds, moved)
                values[f"{name}_{suffix}"] = NAN if found is None else found
        cached = max(0.0, now.cached_tokens - before.cached_tokens)
        prompt = max(0.0, now.prompt_tokens - before.prompt_tokens)
        values["prompt_tokens_cached"] = cached
        values["prompt_tokens_computed"] = max(0.0, prompt - cached)
        return values

    def _forget(self, oldest: int) -> None:
        """Models and backends whose last sample has left the rings."""
        for table in (self.models, self.backends):
            for key in [k for k, v in table.items() if v.last_seen < oldest]:
                del table[key]

    def note(self, events: Iterable[Event]) -> None:
        """Lifecycle events read from the log, in order: they go with the next sample."""
        tick = self.tick
        for event in events:
            self.events.append(event)
            self.noted_at.append(tick)

    # -- reading ------------------------------------------------------------------

    def answer(self, since: float | None = None) -> dict[str, Any]:
        """The samples newer than ``since`` (wall seconds; None: all), at most the
        newest ``MAX_ANSWER_SAMPLES`` of them, and the events that go with them: the
        fields ``times``, ``truncated`` (older samples left out), ``machine``,
        ``models``, ``backends`` and ``events`` of ``GET /v1/ui/history``. A page that
        asks since its last sample's time gets each event once, even one older than that
        sample but read from the log after it. Without ``since`` and with every sample,
        every event kept is answered, even those whose samples have left the rings;
        never one noted for a sample not yet taken."""
        stop = self.tick
        start = self.times.oldest
        times = self.times.span(start, stop)
        if since is not None:
            newer = len(times)
            while newer > 0 and times[newer - 1] > since:
                newer -= 1
            start, times = start + newer, times[newer:]
        truncated = len(times) > MAX_ANSWER_SAMPLES
        if truncated:
            start, times = stop - MAX_ANSWER_SAMPLES, times[-MAX_ANSWER_SAMPLES:]
        every = since is None and not truncated
        return {
            "times": times,
            "truncated": truncated,
            "machine": {name: _shown(r.span(start, stop)) for name, r in self.machine.items()},
            "models": [
                {
                    "model": model,
                    "series": {n: _shown(r.span(start, stop)) for n, r in series.rings.items()},
                }
                for model, series in self.models.items()
            ],
            "backends": [
                {
                    "role": role,
                    "model": lane.model,
                    "states": [
                        None if s == MISSING_STATE else LANES[int(s)]
                        for s in lane.states.span(start, stop)
                    ],
                    "restart_budget": lane.budget,
                }
                for role, lane in self.backends.items()
            ],
            "events": [
                event.to_json()
                for event, noted_at in zip(self.events, self.noted_at, strict=True)
                if noted_at < stop and (every or noted_at >= start)
            ],
        }


def _shown(values: list[float]) -> list[float | None]:
    """Values as the answer shows them: null for none (NaN is the one value not equal
    to itself)."""
    return [v if v == v else None for v in values]


__all__ = [
    "GROUPS",
    "MACHINE",
    "MAX_ANSWER_SAMPLES",
    "MAX_EVENTS",
    "SERIES",
    "BackendReading",
    "Buckets",
    "History",
    "ModelReading",
    "Snapshot",
    "quantile",
]
