"""Room in memory for a model waiting to load: whether it fits now, and which loaded
models must go first. Pure: the router's loader hands in what it knows and acts on the
answer.

The rules, in order:

1. A model larger than the whole budget never loads (``impossible``).
2. It loads when its footprint fits beside every model holding memory (loaded,
   loading, or unloading until it is gone) and ``max_loaded`` allows one more.
3. Otherwise room is made from ``load: on_demand`` models only, least recently used
   first; never an ``always`` model, never one with requests in flight, never one with
   requests queued (unless it is draining: its queue waits for its next load).
4. No thrash: a model that served a request within ``hold_seconds`` is kept, unless the
   waiter has waited ``aging_seconds``; then the models in its way are *drained* (they
   stop admitting, finish what is in flight) and go once idle.
5. Nothing is evicted unless evicting lets the waiter fit: a model is never unloaded
   for a load that still could not happen.

Between two loads of the same set of models at least ``hold_seconds`` pass (a victim
is idle that long) or ``aging_seconds`` (a waiter aged), so alternating traffic between
two models that cannot both fit swaps at most once per ``hold_seconds``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Holder:
    """A model holding memory, or about to: loaded, loading or unloading."""

    role: str
    model_id: str
    footprint_mb: int
    on_demand: bool
    in_flight: int = 0
    queued: int = 0
    last_used: float = 0.0  # when it last finished a request (or became ready)
    unloading: bool = False
    draining: bool = False

    @property
    def idle(self) -> bool:
        """No request in flight, and none queued that it would serve before going."""
        return self.in_flight == 0 and (self.queued == 0 or self.draining)


@dataclass(frozen=True)
class Rules:
    budget_mb: int
    max_loaded: int | None
    hold_seconds: float
    aging_seconds: float


@dataclass(frozen=True)
class Room:
    """The answer for one waiting model: ``load`` now; or unload ``evict`` (idle) and
    drain ``drain`` (busy, in the way of an aged waiter) and ask again once they are
    gone; or wait (``why``); or never (``impossible``)."""

    load: bool
    evict: tuple[str, ...] = ()
    drain: tuple[str, ...] = ()
    why: str = ""
    impossible: bool = False


def make_room(
    role: str,
    footprint_mb: int,
    waiting_since: float,
    holders: Sequence[Holder],
    rules: Rules,
    now: float,
) -> Room:
    """Room for ``role`` (``footprint_mb``, waiting since ``waiting_since``) beside
    ``holders`` (the model itself left out if it is among them)."""
    if footprint_mb > rules.budget_mb:
        return Room(
            False,
            why=(
                f"it needs {footprint_mb} MiB, more than the whole memory budget of "
                f"{rules.budget_mb} MiB (SLM_MEMORY_BUDGET_MB)"
            ),
            impossible=True,
        )
    others = [h for h in holders if h.role != role]

    def fits(kept: Sequence[Holder]) -> bool:
        used = sum(h.footprint_mb for h in kept)
        count_ok = rules.max_loaded is None or len(kept) + 1 <= rules.max_loaded
        return used + footprint_mb <= rules.budget_mb and count_ok

    if fits(others):
        return Room(True)
    # What is unloading already will be gone: plan as if it were.
    kept = [h for h in others if not h.unloading]
    going = len(kept) < len(others)
    aged = now - waiting_since >= rules.aging_seconds
    evict: list[str] = []
    drain: list[str] = []
    candidates = sorted((h for h in kept if h.on_demand), key=lambda h: h.last_used)
    for holder in candidates:
        if fits(kept):
            break
        held_recently = now - holder.last_used < rules.hold_seconds and not holder.draining
        if holder.idle and (aged or not held_recently):
            evict.append(holder.role)
        elif aged:
            drain.append(holder.role)
        else:
            continue
        kept = [h for h in kept if h.role != holder.role]
    if not fits(kept):
        return Room(False, why=_why_not(footprint_mb, others, rules))
    if not evict and not drain and going:
        return Room(False, why="waiting for a model being unloaded to make room")
    return Room(False, tuple(evict), tuple(drain), why="making room")


def _why_not(footprint_mb: int, others: Sequence[Holder], rules: Rules) -> str:
    used = sum(h.footprint_mb for h in others)
    if rules.max_loaded is not None and len(others) + 1 > rules.max_loaded:
        limit = f"{len(others)} models are loaded (SLM_MAX_LOADED={rules.max_loaded})"
    else:
        limit = (
            f"{used} of {rules.budget_mb} MiB are held (SLM_MEMORY_BUDGET_MB) and it "
            f"needs {footprint_mb} MiB"
        )
    busy = [h.model_id for h in others if not h.on_demand or not h.idle]
    held = f"; in use: {', '.join(busy)}" if busy else ""
    return f"{limit}{held}"


__all__ = ["Holder", "Room", "Rules", "make_room"]
