"""Waiting on a backend without waiting forever: the request's deadline, the client's
presence and the router's drain all bound every wait.

The wait runs in the request's own task. One watcher task per request
(:class:`ClientWatch`, started by the request's first wait and shared with its stream
relay) listens for the client's disconnect and cancels whatever wait is current; the
drain cancels every registered wait at once. The cancellation is then turned into the
error that says why.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from starlette.types import Message, Receive, Scope

from slm_server.errors import BackendUnavailable, ClientDisconnected

_T = TypeVar("_T")
_SCOPE_KEY = "slm.client"
_loop: asyncio.AbstractEventLoop | None = None


class ClientWatch:
    """Whether one request's client is still there, heard by a single watcher task.

    The watcher starts on the first :meth:`arm` and ends when the client disconnects
    or the response is complete (the server then reports a disconnect too).
    """

    __slots__ = ("_on_gone", "_receive", "_task", "gone")

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self._task: asyncio.Task[None] | None = None
        self._on_gone: Callable[[], None] | None = None
        self.gone = False

    def arm(self, on_gone: Callable[[], None]) -> bool:
        """Call ``on_gone`` (from the watcher task) when the client disconnects, until
        :meth:`disarm`; False, and no call, when it is gone already."""
        if self.gone:
            return False
        self._on_gone = on_gone
        if self._task is None:
            self._task = running_loop().create_task(self._watch())
        return True

    def disarm(self) -> None:
        self._on_gone = None

    async def _watch(self) -> None:
        while True:
            message: Message = await self._receive()
            if message["type"] == "http.disconnect":
                self.gone = True
                on_gone, self._on_gone = self._on_gone, None
                if on_gone is not None:
                    on_gone()
                return


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
        watch = state[_SCOPE_KEY] = ClientWatch(receive)
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
