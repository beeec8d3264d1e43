"""A request the backend stranded is sent again, once: one that got nothing of its
answer before the connection broke, or was refused, because the process it was sent to
is gone (the watchdog killed a wedged backend, or it exited). It waits, within its
deadline, for the supervisor to publish the backend ready with a new process, and is
then sent again; it is never sent again when the process it was sent to still runs
(the connection broke for a reason of its own), when the supervisor gives the backend
up, or without a supervisor to say.
"""

from __future__ import annotations

import asyncio

import psutil

from slm_server.contracts.verdicts import BROKEN, UNREACHABLE, outcome_of
from slm_server.errors import GatewayError
from slm_server.registry.schema import ModelSpec
from slm_server.router.call.admitted_call import Call
from slm_server.router.call.backend_state import StateSource
from slm_server.router.call.waits import Waits

# How often the published state is looked at while a stranded request waits.
POLL_SECONDS = 0.05
# States the backend comes back from (the supervisor relaunches it).
COMING_BACK = frozenset({"ready", "starting", "restarting"})
# A process killed closes its sockets before it has exited: a connection it broke as it
# died may be seen a moment before the process is gone. Looked at for this long.
DYING_SECONDS = 1.0


class Recovery:
    """Whether, and when, a stranded request is sent again, for one router."""

    def __init__(self, states: StateSource, waits: Waits) -> None:
        self.states = states
        self.waits = waits

    def process(self, spec: ModelSpec) -> int | None:
        """The pid of the process a request to ``spec`` is sent to now, as published
        (whether the supervisor still runs is asked only if the request fails); None
        when none is published."""
        state = self.states.get(spec.role, spec.entry.port)
        return None if state is None else state.pid

    async def stranded(self, call: Call, error: GatewayError, sent_to: int | None) -> bool:
        """Whether to send ``call`` again after ``error``: a refused or broken
        connection to process ``sent_to``, which is gone. Returns once the backend is
        ready again with another process (True), or once it will not be (False); the
        call's deadline, the client's leaving and the drain end the wait with their
        own errors."""
        if sent_to is None or outcome_of(error) not in (UNREACHABLE, BROKEN):
            return False
        if not self.states.launcher_alive():
            return False
        return await self.waits.run(call.client, self._back(call.spec, sent_to), call.deadline.at)

    async def _back(self, spec: ModelSpec, gone: int) -> bool:
        dying_until = asyncio.get_running_loop().time() + DYING_SECONDS
        while _runs(gone):
            if asyncio.get_running_loop().time() > dying_until:
                return False  # it lives: the connection broke for a reason of its own
            await asyncio.sleep(POLL_SECONDS)
        while True:
            state = self.states.current(spec.role, spec.entry.port)
            if state is None or not self.states.launcher_alive():
                return False
            if state.state not in COMING_BACK:
                return False
            if state.state == "ready" and state.pid not in (None, gone):
                return True
            await asyncio.sleep(POLL_SECONDS)


def _runs(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie does not: it has exited, and only
    waits for its parent)."""
    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.Error:
        return False


__all__ = ["Recovery"]
