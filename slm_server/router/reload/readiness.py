"""Requests for a backend that is (re)starting wait for it, as for a load: one a reload
started, one the watchdog restarts after an exit or a confirmed trip, one starting with
the gateway.

A backend the supervisor publishes ``starting`` or ``restarting`` comes back ready (or
is given up: abandoned, failed). A request for it waits, holding its admission slot so
the line behind it keeps its order, within its deadline; at the deadline it gets 503
``backend_starting`` or ``backend_restarting`` with ``Retry-After``. The client sees a
delay, not an error.

A backend a reload added or replaced is published ``starting`` with ``reloaded``
until it has been ready once (a replaced one starts only when the old process is
gone). A client that reloads the registry and then asks for the new model should not
get a 503 for asking too soon: its request waits, holding its admission slot so the
line behind it keeps its order, within its deadline, and ends early if the client
leaves or the drain ends (:class:`~slm_server.router.call.waits.Waits`). At the
deadline it gets 503 ``model_loading`` with ``Retry-After``. When the backend stops
being a reloaded one starting (ready, or restarting, failed, abandoned...) the wait
ends and the request goes on as any other: the caller asks again whether the backend
can serve.

The state file is read as requests come, the registry it names is followed at the
next poll: until the router routes by the reload's registry, its requests are routed
(and admitted) as that registry says, and a replaced backend's old process, alive
until it is retired, serves them. Waiting then would hold a slot of the old gate, and
the old process would not be retired before the waiting request's deadline.
"""

from __future__ import annotations

import asyncio
import contextlib

from slm_server.errors import BackendUnavailable
from slm_server.registry.schema import ModelSpec
from slm_server.router.call.backend_state import StateSource, awaits_reload, comes_back
from slm_server.router.call.waits import ClientWatch, Waits, cancel_and_wait, running_loop
from slm_server.router.reload.in_force import InForce
from slm_server.router.upstream.client import RETRY_AFTER_SECONDS

POLL_SECONDS = 0.02  # the state file, while anything waits


class Readiness:
    """The requests waiting for reloaded backends to be ready, by backend."""

    def __init__(self, states: StateSource, waits: Waits, in_force: InForce) -> None:
        self.states = states
        self.waits = waits
        self.in_force = in_force
        self._waiting: dict[tuple[str, int], tuple[ModelSpec, list[asyncio.Future[None]]]] = {}
        self._task: asyncio.Task[None] | None = None

    def awaited(self, spec: ModelSpec) -> bool:
        """Whether requests for ``spec``'s backend wait for it to be ready: a running
        supervisor published it ``starting`` or ``restarting``; one a reload added or
        replaced only once the router routes by that reload's registry."""
        state = self.states.get(spec.role, spec.entry.port)
        if state is not None and comes_back(state):
            # Decided again on the file as it is now: the view may be 20 ms old.
            state = self.states.current(spec.role, spec.entry.port)
        if state is None or not comes_back(state) or not self.states.launcher_alive():
            return False
        if not awaits_reload(state):
            return True
        stamp = self.states.stamp()
        return stamp is None or stamp.version == self.in_force.version

    async def until_ready(self, spec: ModelSpec, client: ClientWatch, until: float) -> None:
        """Return at once unless the backend is awaited; else when it no longer is
        (ready, or given up on: the caller asks again whether it can serve). 503
        ``model_loading`` (a backend a reload started), ``backend_starting`` or
        ``backend_restarting`` when ``until`` (loop time) passes first."""
        if not self.awaited(spec):
            return
        key = (spec.role, spec.entry.port)
        future: asyncio.Future[None] = running_loop().create_future()
        self._waiting.setdefault(key, (spec, []))[1].append(future)
        if self._task is None:
            self._task = running_loop().create_task(self._watch())
        try:
            await self.waits.run(client, future, until)
        except TimeoutError:
            raise self._not_ready(spec) from None
        finally:
            waiting = self._waiting.get(key)
            if waiting is not None:
                with contextlib.suppress(ValueError):
                    waiting[1].remove(future)
                if not waiting[1]:
                    del self._waiting[key]

    def _not_ready(self, spec: ModelSpec) -> BackendUnavailable:
        """The refusal of a request whose deadline passed while it waited."""
        state = self.states.get(spec.role, spec.entry.port)
        if state is not None and awaits_reload(state):
            return BackendUnavailable(
                f"The backend for '{spec.entry.id}' was started by a registry reload and "
                "was not ready within the request's deadline; retry shortly",
                code="model_loading",
                retry_after=RETRY_AFTER_SECONDS,
            )
        what = state.state if state is not None and comes_back(state) else "restarting"
        return BackendUnavailable(
            f"The backend for '{spec.entry.id}' was {what} and was not ready within the "
            "request's deadline; retry shortly",
            code=f"backend_{what}",
            retry_after=RETRY_AFTER_SECONDS,
        )

    async def _watch(self) -> None:
        """Look at the awaited backends every ``POLL_SECONDS`` while anything waits;
        let the waiters of each that is no longer awaited go on."""
        try:
            while self._waiting:
                await asyncio.sleep(POLL_SECONDS)
                for spec, futures in list(self._waiting.values()):
                    if self.awaited(spec):
                        continue
                    for future in futures:
                        if not future.done():
                            future.set_result(None)
        finally:
            self._task = None

    async def stop(self) -> None:
        await cancel_and_wait(self._task)


__all__ = ["Readiness"]
