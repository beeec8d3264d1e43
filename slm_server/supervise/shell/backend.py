"""One registry entry under supervision: its lifecycle (decided by
:mod:`~slm_server.supervise.core.decide`) beside what the shell acts on (its plan, its
process, its expected footprint), and its process's end as the loop observes it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from slm_server.launch import process
from slm_server.launch.plan import LaunchPlan
from slm_server.memory import measure
from slm_server.memory.store import FootprintKey
from slm_server.registry.schema import ModelEntry, ModelSpec
from slm_server.supervise.core.decide import Lifecycle
from slm_server.supervise.core.observations import Exited
from slm_server.supervise.core.phases import Confirming, Ready, Starting
from slm_server.supervise.shell.control import Child


def admitted_mb(
    entry: ModelEntry, measured: int | None, estimate: int | None, prompt_cache: int | None
) -> int | None:
    """What the router admits a backend by: the registry's ``memory_mb``, else the
    footprint measured at its last load, else the estimate, plus what its prompt cache
    may grow to (an unbounded one, ``cache_ram: -1``, adds nothing: it cannot be
    budgeted). Where resident memory misses GPU memory (macOS: Metal's wired memory),
    the larger of the measured and the estimate."""
    if entry.memory_mb is not None:
        return entry.memory_mb
    if measured is None or estimate is None:
        base = measured if measured is not None else estimate
    else:
        base = measured if measure.RSS_COUNTS_GPU_MEMORY else max(measured, estimate)
    return None if base is None else base + (prompt_cache or 0)


class Backend:
    """One registry entry: its lifecycle (decided), its plan and process (acted on)."""

    def __init__(self, spec: ModelSpec, life: Lifecycle) -> None:
        self.spec = spec
        self.life = life
        self.plan: LaunchPlan | None = None
        self.child: Child | None = None
        self.estimate_mb: int | None = None  # the footprint expected before a load
        self.prompt_cache_mb: int | None = 0  # what its prompt cache may hold (None: no limit)
        # Its slots kept across unloads (slm_server.slotcache): the tokens saved for its
        # launch (None: not kept, ``slot_skip`` says why), and the process they were
        # last restored into.
        self.slot_tokens: int | None = None
        self.slot_skip: str | None = None
        self.restored_pid: int | None = None
        self.footprint_key: FootprintKey | None = None  # where its measurement is kept

    @property
    def footprint_mb(self) -> int | None:
        """What the router admits this backend by (:func:`admitted_mb`)."""
        return admitted_mb(
            self.spec.entry, self.life.measured_mb, self.estimate_mb, self.prompt_cache_mb
        )

    @property
    def role(self) -> str:
        return self.spec.role

    def exited(self, tail: Callable[[Path, int], list[str]]) -> Exited | None:
        """Its process's end, when it is starting or serving and ended by itself
        (polled, never blocking); ``tail`` reads the last lines of its log."""
        life, child = self.life, self.child
        if child is None or not life.alive:
            return None
        if not isinstance(life.phase, Starting | Ready | Confirming):
            return None
        status = child.poll()
        if status is None:
            return None
        path = self.plan.log_path if self.plan is not None else None
        return Exited(
            role=self.role,
            pid=child.pid,
            status=status,
            description=process.describe_exit(status),
            tail=tuple(tail(path, 8)) if path is not None else (),
            log_path=str(path) if path is not None else "",
        )
