"""Waiting on a backend without waiting forever: the request's deadline, the client's
presence and the router's drain all bound every wait.

The wait runs in the request's own task. The request's :class:`ClientWatch` (shared
by its waits and its stream relay) hears of the client's leaving and cancels whatever
wait is current: from the door (its
:class:`~slm_server.router.call.fast_path.FastPath`, told the moment the connection is
lost), or, where no door serves the request (an in-process
ASGI client), from a watcher task started by the first wait that awaits ASGI's
``http.disconnect``. The drain cancels every registered wait at once. The cancellation
is then turned into the error that says why.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from starlette.types import Message, Receive, Scope

from slm_server.errors import BackendUnavailable, ClientDisconnected
from slm_server.router.call.exchange import Exchange, exchange_of
from slm_server.router.call.fast_path import FastPath, fast_path_of

_T = TypeVar("_T")
_SCOPE_KEY = "slm.client"
_loop: asyncio.AbstractEventLoop | None = None


class ClientWatch:
    """Whether one request's client is still there.

    Told by the door's ``presence`` when there is one (the request's exchange is then
    marked ``disconnected`` here, as the access middleware marks it when it sees the
    ``http.disconnect``); else heard by a watcher task that starts on the first
    :meth:`arm` and ends when the client disconnects or the response is complete (the
    server then reports a disconnect too).
    """

    __slots__ = ("_exchange", "_on_gone", "_receive", "_task", "_told", "gone")

    def __init__(
        self,
        receive: Receive,
        presence: FastPath | None = None,
        exchange: Exchange | None = None,
    ) -> None:
        # Told by the door, the watch never reads ``receive``; keeping it would tie the
        # request's scope to its connection's cycle in a loop only the collector frees.
        self._receive = receive if presence is None else None
        self._task: asyncio.Task[None] | None = None
        # Who hears of the client's leaving: the innermost of nested arms (a wait inside
        # a stream relay's), the outer one again once the inner one disarms.
        self._on_gone: list[Callable[[], None]] = []
        self._exchange = exchange
        self.gone = False
        self._told = presence is not None  # by the door: no watcher task
        if presence is not None:
            if presence.gone:
                self._heard()
            else:
                presence.on_gone = self._heard

    def _heard(self) -> None:
        self.gone = True
        if self._exchange is not None:
            self._exchange.disconnected = True
        if self._on_gone:
            self._on_gone[-1]()

    def arm(self, on_gone: Callable[[], None]) -> bool:
        """Call ``on_gone`` (from the door or the watcher task) when the client disconnects,
        until :meth:`disarm`; False, and no call, when it is gone already. Arms nest: a
        wait armed while a relay is armed is told instead of it, until it disarms."""
        if self.gone:
            return False
        self._on_gone.append(on_gone)
        if self._task is None and not self._told:
            self._task = running_loop().create_task(self._watch())
        return True

    def disarm(self) -> None:
        """Forget the last :meth:`arm` that returned True (its caller's own)."""
        if self._on_gone:
            self._on_gone.pop()

    async def _watch(self) -> None:
        receive = self._receive
        assert receive is not None  # armed without a door only
        while True:
            message: Message = await receive()
            if message["type"] == "http.disconnect":
                self._heard()
                return


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel a background task of the router's and wait until it has ended (its
    cancellation swallowed): how each loop of its own is stopped at shutdown."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def running_loop() -> asyncio.AbstractEventLoop:
    """The running event loop. ``asyncio.get_running_loop()`` makes a ``getpid()``
    system call each time on Python 3.11, several per request; the router runs on one
    loop, so it is asked only when the loop last seen is no longer running."""
    global _loop
    loop = _loop
    if loop is None or not loop.is_running():
        loop = _loop = asyncio.get_running_loop()
    return loop


def client_of(scope: Scope, receive: Receive) -> ClientWatch:
    """The request's :class:`ClientWatch`, made on first use."""
    state = scope.setdefault("state", {})
    watch = state.get(_SCOPE_KEY)
    if not isinstance(watch, ClientWatch):
        presence = fast_path_of(scope)
        if presence is not None:
            watch = ClientWatch(receive, presence, exchange_of(scope))
        else:
            watch = ClientWatch(receive)
        state[_SCOPE_KEY] = watch
    return watch


class Waits:
    """Every request currently waiting on a backend, and why one was cancelled."""

    def __init__(self) -> None:
        self._waiting: dict[asyncio.Task[Any], list[str]] = {}

    async def run(self, client: ClientWatch, work: Awaitable[_T], until: float) -> _T:
        """Await ``work``; raises ``TimeoutError`` at loop time ``until``,
        :class:`ClientDisconnected` when the client leaves first, and
        :class:`BackendUnavailable` (``shutting_down``) when the drain period ends."""
        loop = running_loop()
        task = asyncio.current_task(loop)
        assert task is not None
        why: list[str] = []

        def client_left() -> None:
            why.append("client")
            task.cancel()

        def timed_out() -> None:
            why.append("timeout")
            task.cancel()

        if not client.arm(client_left):
            close = getattr(work, "close", None)
            if close is not None:
                close()  # a coroutine never started
            raise ClientDisconnected("The client went away before the answer")
        timer = loop.call_at(until, timed_out)
        self._waiting[task] = why
        try:
            return await work
        except asyncio.CancelledError:
            if not why:
                raise
            still = 0
            for _ in why:  # one cancel per reason
                still = task.uncancel()
            if still > 0:
                raise  # cancelled from outside as well
            if why[0] == "timeout":
                raise TimeoutError from None
            if why[0] == "client":
                raise ClientDisconnected("The client went away before the answer") from None
            raise BackendUnavailable(
                "The router is shutting down and its drain period ended before this "
                "answer was ready",
                code="shutting_down",
            ) from None
        finally:
            timer.cancel()
            client.disarm()
            self._waiting.pop(task, None)

    def cancel_all(self) -> None:
        """Cancel every wait: the drain period is over."""
        for task, why in list(self._waiting.items()):
            why.append("drain")
            task.cancel()
