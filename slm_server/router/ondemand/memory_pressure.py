"""Memory pressure: what the gateway does when the machine's free memory falls below
the floor (``SLM_MEMORY_FLOOR_MB``). Pure: the router's pressure watch and its loader
hand in the reading and the models holding memory (:class:`Holder`, as
:mod:`~slm_server.router.ondemand.memory_fit` sees them) and act on the answer.

The rules:

1. **Hysteresis.** The machine is *below the floor* from the first reading under
   ``floor_mb`` until a reading of at least ``resume_mb`` (the floor plus a quarter of
   it, at least :data:`MIN_MARGIN_MB`): readings that wander around the floor do not
   turn pressure on and off. A missing reading changes nothing.
2. **Loads are refused** while below the floor: a load would take the memory the
   machine lacks.
3. **Idle on-demand models are evicted**, least recently used first, until what they
   hold (with what is being unloaded already) would bring the free memory back to
   ``resume_mb``: as many as needed, and all of them if that is not enough (each one
   freed is memory the machine gets back). "Idle" is :attr:`Holder.idle`, the rule
   room is made by: nothing in flight and nothing queued (a model that is draining has
   its queue wait for its next load anyway). Never an ``always`` model, never one
   being unloaded already. The swap hold (``SLM_SWAP_HOLD_SECONDS``) does not apply:
   it keeps two models from swapping back and forth, and no load competes while
   loads are refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from slm_server.router.ondemand.memory_fit import Holder

MIN_MARGIN_MB: Final = 256


def resume_mb(floor_mb: int) -> int:
    """The free memory at which pressure ends: the floor plus a quarter of it, and at
    least :data:`MIN_MARGIN_MB` more."""
    return floor_mb + max(MIN_MARGIN_MB, floor_mb // 4)


@dataclass(frozen=True)
class Floor:
    """The least free memory the machine keeps (``floor_mb``; 0: none), and the free
    memory that ends pressure (``resume_mb``)."""

    floor_mb: int
    resume_mb: int

    @classmethod
    def of(cls, floor_mb: int) -> Floor:
        return cls(floor_mb, resume_mb(floor_mb) if floor_mb > 0 else 0)

    @property
    def on(self) -> bool:
        return self.floor_mb > 0


@dataclass(frozen=True)
class Verdict:
    """What one reading means: whether the machine is ``below`` the floor (and so
    loads are refused), whether that changed at this reading (``entered``, ``left``),
    and the idle models to ``evict``, least recently used first."""

    below: bool
    entered: bool = False
    left: bool = False
    evict: tuple[str, ...] = ()

    @property
    def refuse_loads(self) -> bool:
        return self.below


def judge(free_mb: int | None, floor: Floor, was_below: bool, holders: Sequence[Holder]) -> Verdict:
    """The verdict on one reading of free memory (``None``: none could be made)."""
    if not floor.on:
        return Verdict(False, left=was_below)
    if free_mb is None:
        below = was_below
    elif was_below:
        below = free_mb < floor.resume_mb
    else:
        below = free_mb < floor.floor_mb
    entered, left = below and not was_below, was_below and not below
    if not below or free_mb is None:
        return Verdict(below, entered, left)
    freeing = sum(h.footprint_mb for h in holders if h.unloading)
    short = floor.resume_mb - free_mb - freeing
    evict: list[str] = []
    idle = (h for h in holders if h.on_demand and h.idle and not h.unloading)
    for holder in sorted(idle, key=lambda h: h.last_used):
        if short <= 0:
            break
        evict.append(holder.role)
        short -= holder.footprint_mb
    return Verdict(below, entered, left, tuple(evict))


def holders_named(holders: Sequence[Holder]) -> list[dict[str, Any]]:
    """The models holding memory as the ``memory_pressure`` event names them, the
    largest first: ``always`` ones included, and whether each is busy (so not
    evictable)."""
    return [
        {
            "role": h.role,
            "model_id": h.model_id,
            "memory_mb": h.footprint_mb,
            "load": "on_demand" if h.on_demand else "always",
            "busy": not h.idle,
        }
        for h in sorted(holders, key=lambda h: (-h.footprint_mb, h.role))
    ]


def refusal_reason(free_mb: int | None, floor: Floor) -> str:
    """Why a load is refused, in words."""
    free = "unknown" if free_mb is None else f"{free_mb} MiB"
    return (
        f"the machine's free memory ({free}) is below the memory floor of "
        f"{floor.floor_mb} MiB (SLM_MEMORY_FLOOR_MB); loads resume once {floor.resume_mb} "
        "MiB are free"
    )


__all__ = ["Floor", "Verdict", "holders_named", "judge", "refusal_reason", "resume_mb"]
