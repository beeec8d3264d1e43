"""Draining the backends a reload retires, and telling the supervisor when nothing
is in flight on one any more.

A backend a reload removed or replaced keeps its process until the supervisor stops
it (:class:`~slm_server.contracts.applied_registry.Retiring`): at the ``retired``
command, or at its deadline whatever is still in flight. The router admits nothing
new to it (its role left the registry, or has a new gate for the new backend), so
what is in flight is what its old admission gate still holds, active or queued: once
that gate is idle the router sends ``retired``, once per backend (role and pid). A
router that holds no old gate for a retiring backend (it started after the reload)
has nothing in flight on it and says so at once.
"""

from __future__ import annotations

import logging

from slm_server.contracts.applied_registry import Retiring
from slm_server.contracts.commands import Command, CommandError
from slm_server.router.call.admission import Gate
from slm_server.router.ondemand.loader import Commander

log = logging.getLogger("slm_server.router")


class Retirements:
    """The old gates of retired backends, by role, and the ``retired`` commands
    sent."""

    def __init__(self, commander: Commander) -> None:
        self.commander = commander
        self._draining: dict[str, list[Gate]] = {}
        self._known: set[tuple[str, int]] = set()  # retiring backends seen published
        self._sent: set[tuple[str, int]] = set()
        self._undelivered: set[tuple[str, int]] = set()  # a warning was logged for these

    def knows(self, retiring: Retiring) -> bool:
        """Whether ``retiring`` was seen published before (its role's gate was split
        from the new backend's then, or it was retiring when the router started)."""
        return (retiring.role, retiring.pid) in self._known

    def hold(self, role: str, gate: Gate) -> None:
        """``gate`` admitted requests to a backend of ``role`` that a reload removed
        or replaced: watch it drain."""
        self._draining.setdefault(role, []).append(gate)

    def draining(self, role: str) -> tuple[Gate, ...]:
        """The old gates of ``role`` still watched."""
        return tuple(self._draining.get(role, ()))

    async def tick(self, retiring: list[Retiring]) -> None:
        """Send ``retired`` for each published backend whose old gates hold nothing
        (a supervisor that cannot be reached is asked again at the next tick), and
        forget gates that drained with no retiring backend published for them."""
        published = {(r.role, r.pid) for r in retiring}
        self._known |= published
        for backend in retiring:
            key = (backend.role, backend.pid)
            if key in self._sent:
                continue
            if not all(gate.idle for gate in self._draining.get(backend.role, ())):
                continue
            try:
                reply = await self.commander(Command("retired", backend.role, pid=backend.pid))
            except CommandError as exc:
                if key not in self._undelivered:  # said once, not at every tick
                    self._undelivered.add(key)
                    log.warning(
                        "cannot tell the supervisor that %s (pid %d) is drained (asked again "
                        "until it answers): %s",
                        backend.model_id,
                        backend.pid,
                        exc,
                    )
                continue
            self._sent.add(key)
            if not reply.ok:
                log.info(
                    "the supervisor did not take the retirement of %s (pid %d): %s",
                    backend.model_id,
                    backend.pid,
                    reply.error or "no reason given",
                )
            self._draining.pop(backend.role, None)  # idle: nothing can be admitted to it
        self._sent &= published
        self._known &= published
        self._undelivered &= published - self._sent
        roles = {role for role, _pid in published}
        for role, gates in list(self._draining.items()):
            if role in roles:
                continue
            busy = [gate for gate in gates if not gate.idle]
            if busy:
                self._draining[role] = busy
            else:
                del self._draining[role]


__all__ = ["Retirements"]
