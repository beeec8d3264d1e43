"""What the supervisor knows about one backend: its entry, its process and its history."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from slm_server.config import ModelSpec
from slm_server.launch import process
from slm_server.launch.plan import LaunchPlan
from slm_server.launch.records import BackendState
from slm_server.supervise.budget import RestartBudget
from slm_server.supervise.states import State


@dataclass
class Backend:
    """One registry entry and everything the supervisor knows about its process."""

    spec: ModelSpec
    budget: RestartBudget
    state: State = State.STARTING
    plan: LaunchPlan | None = None
    proc: process.BackendProcess | None = None
    started_wall: float | None = None
    since: float = field(default_factory=time.time)
    reason: str | None = None
    restarts: int = 0
    restarts_by_reason: dict[str, int] = field(default_factory=dict)
    last_exit: str | None = None
    last_restart_reason: str | None = None
    pending: str | None = None
    attempt: tuple[int, int | None, str] | None = None
    loading_reported: bool = False
    # False after a launch failed for a reason only an edit of the registry can fix.
    retry_launch: bool = True
    # True while the last attempt spawned nothing: no process to cool down after.
    launch_failed: bool = False

    @property
    def role(self) -> str:
        return self.spec.role

    def ids(self) -> dict[str, object]:
        """The fields that name this backend in every watchdog event."""
        entry = self.spec.entry
        return {"role": self.spec.role, "model_id": entry.id, "port": entry.port}

    def snapshot(self, log_dir_path: str) -> BackendState:
        proc = self.proc
        return BackendState(
            role=self.spec.role,
            model_id=self.spec.entry.id,
            backend=self.spec.entry.backend,
            port=self.spec.entry.port,
            state=self.state.value,
            pid=proc.pid if proc is not None and proc.alive() else None,
            since=self.since,
            started_at=self.started_wall if proc is not None and proc.alive() else None,
            exit_status=proc.exit_status if proc is not None else None,
            restarts=self.restarts,
            reason=self.reason,
            log_path=str(self.plan.log_path) if self.plan is not None else log_dir_path,
            last_exit=self.last_exit,
            last_restart_reason=self.last_restart_reason,
            restarts_by_reason=dict(self.restarts_by_reason),
        )
