"""Backends a reload removed or replaced, kept alive while what is in flight on them
ends (:class:`~slm_server.contracts.applied_registry.Retiring` in the state file).

A retiring backend is out of the registry: :func:`~slm_server.supervise.core.decide.decide`
no longer sees it, nothing restarts it, and the router sends it no new request. It is
stopped when the router says nothing is in flight on it any more (the ``retired``
command), when its ``deadline`` (the drain timeout) passes, or at shutdown; a process
that ends by itself meanwhile is simply gone. Each ends with ``backend_retired``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from slm_server.contracts.applied_registry import RetireReason, Retiring
from slm_server.supervise.shell.backend import Backend
from slm_server.supervise.shell.control import Child


@dataclass
class Retiree:
    """One retiring backend and what ends its drain."""

    backend: Backend
    child: Child
    record: Retiring
    drained: bool = False  # the router said nothing is in flight on it
    stopping: bool = False  # its stop is under way

    def why_now(self, wall: float) -> str | None:
        """Why it should stop now (``drained``, ``deadline``, ``exited``), else None."""
        if self.stopping:
            return None
        if self.child.poll() is not None:
            return "exited"
        if self.drained:
            return "drained"
        if wall >= self.record.deadline:
            return "deadline"
        return None


class Retirements:
    """Every retiring backend of one supervisor, by pid."""

    def __init__(self, drain_seconds: float, wall: Callable[[], float]) -> None:
        self.drain_seconds = drain_seconds
        self.wall = wall
        self.by_pid: dict[int, Retiree] = {}

    def add(self, backend: Backend, reason: RetireReason) -> Retiring | None:
        """Retire ``backend``'s live process; None when it has none (nothing to drain)."""
        child = backend.child
        if child is None or child.poll() is not None:
            return None
        now = self.wall()
        record = Retiring(
            role=backend.role,
            model_id=backend.spec.entry.id,
            port=backend.spec.entry.port,
            pid=child.pid,
            reason=reason,
            since=round(now, 3),
            deadline=round(now + self.drain_seconds, 3),
        )
        self.by_pid[child.pid] = Retiree(backend, child, record)
        return record

    def drained(self, role: str, pid: int) -> bool:
        """The router's ``retired``: whether it named a backend retiring here."""
        retiree = self.by_pid.get(pid)
        if retiree is None or retiree.record.role != role:
            return False
        retiree.drained = True
        return True

    def due(self) -> list[tuple[Retiree, str]]:
        """The retirees to stop now, each with why."""
        wall = self.wall()
        found = []
        for retiree in self.by_pid.values():
            why = retiree.why_now(wall)
            if why is not None:
                found.append((retiree, why))
        return found

    def holder(self, role: str, port: int) -> int | None:
        """The pid of a retiring process of ``role``, else of one on ``port``: what a
        backend taking that role or port must wait for."""
        for retiree in self.by_pid.values():
            if retiree.record.role == role:
                return retiree.record.pid
        for retiree in self.by_pid.values():
            if retiree.record.port == port:
                return retiree.record.pid
        return None

    def records(self) -> list[Retiring]:
        return [r.record for r in self.by_pid.values()]

    def backends(self) -> list[Backend]:
        return [r.backend for r in self.by_pid.values()]

    def done(self, pid: int) -> Retiree | None:
        return self.by_pid.pop(pid, None)


__all__ = ["Retiree", "Retirements"]
