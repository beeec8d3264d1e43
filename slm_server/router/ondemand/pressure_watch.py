"""The router's watch on the machine's free memory: a task reads the memory source
every ``SLM_MEMORY_POLL_SECONDS``, judges each reading against the floor
(:func:`~slm_server.router.ondemand.memory_pressure.judge`), writes
``memory_pressure`` when the machine goes below the floor or comes back, and hands
the models to evict to the on-demand planner, which unloads them the way it unloads
for room (its gate paused in the same step as the check that it is idle) and refuses
loads while the machine is below the floor.

This task is the one writer of the pressure state; the planner reads it. Each
reading's evictions are handed over once (:meth:`PressureWatch.take_evictions`), so
a model freed after a reading was taken is not counted twice. The models holding
memory are looked at just before each reading: a model whose unload ends between the
two counts as still freeing, so the error is towards evicting too few this turn
(corrected at the next reading), never too many.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

from slm_server.contracts.events import EventSink
from slm_server.memory.available import MemorySource
from slm_server.router.call.periodic import Periodic
from slm_server.router.ondemand.memory_fit import Holder
from slm_server.router.ondemand.memory_pressure import Floor, Verdict, holders_named, judge

log = logging.getLogger("slm_server.router")

Holders = Callable[[], Sequence[Holder]]


class PressureWatch:
    """The machine's free memory as last read, whether it is below the floor, and the
    idle models the last reading asks to evict."""

    def __init__(
        self,
        source: MemorySource,
        floor: Floor,
        events: EventSink,
        *,
        poll_seconds: float,
        budget_mb: int,
    ) -> None:
        self.source = source
        self.floor = floor
        self.events = events
        self.poll_seconds = poll_seconds
        self.budget_mb = budget_mb
        self.free_mb: int | None = None
        self.below = False
        self.readings = 0
        self._evict: tuple[str, ...] = ()
        self._holders: Holders = list
        self._wake: Callable[[], None] = lambda: None
        self._task = Periodic(
            self._turn,
            after_failure=lambda: self.poll_seconds,
            log=log,
            failure="the memory pressure watch failed a reading",
        )

    def bind(self, holders: Holders, wake: Callable[[], None]) -> None:
        """Where the models holding memory come from, and whom to wake after a reading
        (the planner)."""
        self._holders, self._wake = holders, wake

    # -- readings -------------------------------------------------------------------

    async def read(self) -> Verdict:
        """Take one reading and act on it (a source that fails gives no reading)."""
        holders = self._holders()
        try:
            free = await asyncio.to_thread(self.source.available_mb)
        except Exception:
            log.exception("reading the machine's free memory (%s) failed", self.source.name)
            free = None
        return self.observe(free, holders)

    def observe(self, free_mb: int | None, holders: Sequence[Holder]) -> Verdict:
        """Judge a reading taken with ``holders`` holding memory: keep it, write the
        event when the machine crosses the floor, and wake the planner."""
        verdict = judge(free_mb, self.floor, self.below, holders)
        self.readings += 1
        self.free_mb = free_mb
        self.below = verdict.below
        self._evict = verdict.evict
        if verdict.entered or verdict.left:
            self.events.emit(
                "memory_pressure",
                state="entered" if verdict.entered else "left",
                free_mb=free_mb,
                floor_mb=self.floor.floor_mb,
                resume_mb=self.floor.resume_mb,
                source=self.source.name,
                holders=holders_named(holders),
            )
            log.warning(
                "memory pressure %s: %s MiB free, floor %d MiB",
                "entered" if verdict.entered else "left",
                free_mb,
                self.floor.floor_mb,
            )
        self._wake()
        return verdict

    def take_evictions(self) -> tuple[str, ...]:
        """The models the last reading asks to evict, once."""
        evict, self._evict = self._evict, ()
        return evict

    def evicted(self, role: str, model_id: str, port: int, memory_mb: int) -> None:
        """The planner unloaded ``role`` for pressure (the supervisor took the command)."""
        self.events.emit(
            "evicted_for_pressure",
            role=role,
            model_id=model_id,
            port=port,
            memory_mb=memory_mb,
            free_mb=self.free_mb,
            floor_mb=self.floor.floor_mb,
        )

    # -- the task -------------------------------------------------------------------

    def start(self) -> None:
        """Read every ``poll_seconds`` on the current loop."""
        self._task.start()

    async def stop(self) -> None:
        await self._task.stop()

    async def _turn(self) -> float:
        await self.read()
        return self.poll_seconds

    # -- reporting ------------------------------------------------------------------

    def report(self) -> dict[str, Any]:
        """The ``memory`` object of ``GET /health``."""
        holders = self._holders()
        return {
            "free_mb": self.free_mb,
            "floor_mb": self.floor.floor_mb,
            "resume_mb": self.floor.resume_mb,
            "below_floor": self.below,
            "source": self.source.name,
            "budget_mb": self.budget_mb,
            "held_mb": sum(h.footprint_mb for h in holders),
        }


__all__ = ["PressureWatch"]
