"""What each backend weighs: the estimate from its files and settings, the size its
prompt cache is given, the resident memory measured when it became ready or grew while
serving (decided by :mod:`~slm_server.supervise.core.decide`: :class:`Measured`,
:class:`Remember`), and the store that remembers a measurement across runs."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from slm_server.contracts.states import State
from slm_server.launch.footprint import NoEstimate, estimate_entry, footprint_key, prompt_cache_mb
from slm_server.memory.store import FootprintKey, FootprintStore
from slm_server.registry.schema import ModelSpec
from slm_server.supervise.core.observations import Measured
from slm_server.supervise.shell.backend import Backend
from slm_server.supervise.shell.control import ProcessControl
from slm_server.supervise.shell.housekeeping import ChoreErrors

log = logging.getLogger("slm_server.supervisor")


@dataclass(frozen=True)
class Expected:
    """Where an entry's footprint is kept, its estimate, the one remembered from an
    earlier load of the same files and settings (both without the prompt cache), and
    its prompt cache's size (``None``: unbounded)."""

    key: FootprintKey | None = None
    estimate_mb: int | None = None
    remembered_mb: int | None = None
    prompt_cache_mb: int | None = 0


class Footprints:
    """Estimates, measurements and the store, through the process control."""

    def __init__(
        self,
        path: Path,
        control: ProcessControl,
        chores: ChoreErrors,
        *,
        native: bool,
        budget_mb: int,
    ) -> None:
        self.store = FootprintStore(path)
        self.control = control
        self.chores = chores
        self.native = native  # whether llama.cpp entries run the native llama-server
        self.budget_mb = budget_mb

    def expect(self, spec: ModelSpec) -> Expected:
        entry = spec.entry
        key = footprint_key(entry)
        remembered = self.store.get(key) if key is not None else None
        estimate = None
        try:
            estimate = estimate_entry(entry).mb
        except NoEstimate as exc:
            log.info("no memory estimate for %s (%s): %s", spec.role, entry.id, exc)
        cache = prompt_cache_mb(entry, self.native, self.budget_mb)
        return Expected(key, estimate, remembered, cache)

    def measure(self, backends: Iterable[Backend]) -> list[Measured]:
        """Serving grows a backend (buffers on its first requests, the prompt cache):
        each ready one, measured again."""
        found: list[Measured] = []
        for backend in backends:
            life, child = backend.life, backend.child
            if life.state is not State.READY or child is None or not life.alive:
                continue
            resident = self.control.resident_mb(child.pid)
            if resident is not None:
                admitted, cache = backend.footprint_mb, backend.prompt_cache_mb
                found.append(Measured(backend.role, resident, admitted, cache))
        return found

    def remember(self, backend: Backend, resident_mb: int) -> None:
        """Keep ``resident_mb`` for the backend's files and settings (a failed write is
        ``state_write_failed``, reported once)."""
        key = backend.footprint_key
        if key is None or self.store.get(key) == resident_mb:
            return
        if self.store.put(key, resident_mb):
            self.chores.done(str(self.store.path))
        else:
            error = OSError(self.store.last_error or "cannot write")
            self.chores.failed("state_write_failed", str(self.store.path), error)
