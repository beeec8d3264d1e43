"""Waiting on a backend without waiting forever: the request's deadline, the client's
presence and the router's drain all bound every wait.

The wait runs in the request's own task; a watcher task listens for the client's
disconnect and cancels it, and the drain cancels every registered wait at once. The
cancellation is then turned into the error that says why.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from slm_server.errors import BackendUnavailable, ClientDisconnected

_T = TypeVar("_T")


async def until_disconnected(receive: Callable[[], Awaitable[Any]]) -> None:
    """Return once the ASGI client has disconnected."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


class Waits:
    """Every request currently waiting on a backend, and why one was cancelled."""

    def __init__(self) -> None:
        self._waiting: dict[asyncio.Task[Any], list[str]] = {}

    async def run(
        self, receive: Callable[[], Awaitable[Any]], work: Awaitable[_T], timeout: float
    ) -> _T:
        """Await ``work``; raises ``TimeoutError`` past ``timeout``,
        :class:`ClientDisconnected` when the client leaves first, and
        :class:`BackendUnavailable` (``shutting_down``) when the drain period ends."""
        task = asyncio.current_task()
        assert task is not None
        why: list[str] = []

        async def watch() -> None:
            await until_disconnected(receive)
            why.append("client")
            task.cancel()

        watcher = asyncio.ensure_future(watch())
        self._waiting[task] = why
        try:
            async with asyncio.timeout(timeout):
                return await work
        except asyncio.CancelledError:
            if not why:
                raise
            task.uncancel()
            if why[0] == "client":
                raise ClientDisconnected("The client went away before the answer") from None
            raise BackendUnavailable(
                "The router is shutting down and its drain period ended before this "
                "answer was ready",
                code="shutting_down",
            ) from None
        finally:
            watcher.cancel()
            self._waiting.pop(task, None)

    def cancel_all(self) -> None:
        """Cancel every wait: the drain period is over."""
        for task, why in list(self._waiting.items()):
            why.append("drain")
            task.cancel()
