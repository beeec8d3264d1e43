"""Publishing what the supervisor knows: the state file (every backend's state, for the
router and the ``status`` command) and the pidfile (the processes to stop should this
supervisor die without stopping them), written together whenever anything changed."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

from slm_server.contracts.applied_registry import RegistryStamp, Retiring
from slm_server.contracts.records import (
    BackendState,
    PidRecord,
    process_create_time,
    write_pidfile,
    write_state,
)
from slm_server.contracts.states import State
from slm_server.settings import Settings
from slm_server.supervise.shell.backend import Backend
from slm_server.supervise.shell.housekeeping import ChoreErrors
from slm_server.supervise.shell.remotes import Remotes


def snapshot(backend: Backend, log_dir_path: str, now: float, wall: float) -> BackendState:
    """What the state file publishes for ``backend`` (``now`` monotonic and ``wall``
    clock of the same moment, to show when the budget frees up)."""
    spec, life, child, plan = backend.spec, backend.life, backend.child, backend.plan
    alive = child is not None and life.alive
    budget = life.budget
    return BackendState(
        role=spec.role,
        model_id=spec.entry.id,
        backend=spec.entry.backend,
        port=spec.entry.port,
        state=life.state.value,
        pid=child.pid if alive and child is not None else None,
        since=life.since,
        started_at=life.started_wall if alive else None,
        exit_status=child.exit_status if child is not None else None,
        restarts=life.restarts,
        reason=life.reason,
        log_path=str(plan.log_path) if plan is not None else log_dir_path,
        last_exit=life.last_exit,
        last_restart_reason=life.last_restart_reason,
        restarts_by_reason=dict(life.restarts_by_reason),
        kind=plan.kind if plan is not None else None,
        health_path=plan.health_path if plan is not None else "/health",
        request_defaults=dict(plan.request_defaults) if plan is not None else {},
        budget_max=budget.max_restarts,
        budget_window_seconds=budget.window,
        budget_spent_at=[round(wall - (now - t), 3) for t in budget.spent_at(now)],
        load=spec.entry.load,
        memory_estimate_mb=backend.estimate_mb,
        memory_measured_mb=life.measured_mb,
        footprint_mb=backend.footprint_mb,
        loaded_at=life.loaded_wall if life.state is State.READY else None,
        prompt_cache_mb=backend.prompt_cache_mb,
        slot_cache_tokens=backend.slot_tokens,
        slot_cache_skip=backend.slot_skip,
        memory_resident_mb=life.resident_mb if alive and life.state is State.READY else None,
        reloaded=life.reloaded,
    )


def pid_records(backends: Iterable[Backend]) -> list[PidRecord]:
    """Every live process of ours, as the pidfile records it."""
    return [
        PidRecord(
            pid=b.child.pid,
            create_time=b.child.create_time,
            port=b.spec.entry.port,
            role=b.role,
            model_id=b.spec.entry.id,
            argv=list(b.plan.argv),
        )
        for b in backends
        if b.child is not None and b.plan is not None and b.child.poll() is None
    ]


class Publisher:
    """Writes the state file and the pidfile when ``dirty``; a failed write is
    reported (``state_write_failed``) and retried on the next call."""

    def __init__(
        self,
        settings: Settings,
        chores: ChoreErrors,
        clock: Callable[[], float],
        wall: Callable[[], float],
    ) -> None:
        self.settings = settings
        self.chores = chores
        self.clock = clock
        self.wall = wall
        self.pid = os.getpid()
        self.create_time = process_create_time(self.pid)
        self.dirty = True

    def publish(
        self,
        backends: Iterable[Backend],
        remotes: Remotes,
        stamp: RegistryStamp | None = None,
        retiring: Iterable[tuple[Backend, Retiring]] = (),
    ) -> None:
        """Publish ``backends``, the remotes' standings, the registry in force and the
        backends a reload retires, if anything changed since the last write (the
        pidfile lists the retiring processes too: they are ours until they end)."""
        if not self.dirty:
            return
        backends = list(backends)
        retiring = list(retiring)
        log_dir = str(self.settings.log_dir)
        now, wall = self.clock(), self.wall()
        snapshots = [snapshot(b, log_dir, now, wall) for b in backends]
        snapshots += remotes.snapshots(now, wall)
        remotes.dirty = False
        records = pid_records([*backends, *(b for b, _r in retiring)])
        self.write(snapshots, records, stamp, [r for _b, r in retiring])

    def write(
        self,
        snapshots: list[BackendState],
        records: list[PidRecord],
        stamp: RegistryStamp | None = None,
        retiring: list[Retiring] | None = None,
    ) -> None:
        """Write both files; ``dirty`` stays set when either failed."""
        pid, create_time = self.pid, self.create_time

        def state(path: Path) -> None:
            write_state(path, pid, snapshots, create_time, stamp, retiring)

        writes: list[tuple[Path, Callable[[Path], None]]] = [
            (self.settings.state_path, state),
            (self.settings.pidfile_path, lambda p: write_pidfile(p, pid, records)),
        ]
        written = True
        for path, write in writes:
            try:
                write(path)
            except OSError as exc:
                written = False
                self.chores.failed("state_write_failed", str(path), exc)
            else:
                self.chores.done(str(path))
        self.dirty = not written
