"""Draining the router on SIGTERM: stop accepting, let in-flight requests finish for
up to ``SLM_DRAIN_TIMEOUT_SECONDS``, then end the rest with a clean error.

uvicorn stops accepting and waits for open connections on its own; :class:`Drain`
adds the deadline after which our streams and pending requests are told why they end.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Callable
from types import FrameType

import anyio
import uvicorn

log = logging.getLogger("slm_server.router")


class Drain:
    """The router's shutdown state: ``draining`` once asked to stop, ``expired`` when
    the drain period is over."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.draining = False
        self.expired = anyio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._listeners: set[Callable[[], None]] = set()

    def subscribe(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` on the event loop when the drain period ends (soon, when
        it already has), unless :meth:`unsubscribe` comes first."""
        if self.expired.is_set():
            asyncio.get_running_loop().call_soon(self._notify, callback)
        self._listeners.add(callback)

    def unsubscribe(self, callback: Callable[[], None]) -> None:
        self._listeners.discard(callback)

    def _notify(self, callback: Callable[[], None]) -> None:
        if callback in self._listeners:
            self._listeners.discard(callback)
            callback()

    def _expire(self) -> None:
        self.expired.set()
        for callback in list(self._listeners):
            self._notify(callback)

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Remember the loop the app runs on (called at startup)."""
        self._loop = loop

    def begin(self) -> None:
        """Start draining (thread- and signal-safe)."""
        if self.draining or self._loop is None:
            return
        self.draining = True
        # A fresh context: the log line must not inherit a request's id.
        self._loop.call_soon_threadsafe(self._schedule, context=contextvars.Context())

    def _schedule(self) -> None:
        assert self._loop is not None
        log.info("draining: in-flight requests have %.3gs to finish", self.timeout)
        self._loop.call_later(self.timeout, self._expire)


class DrainingServer(uvicorn.Server):
    """A uvicorn server that starts the app's drain when it is told to exit."""

    def __init__(self, config: uvicorn.Config, drain: Drain) -> None:
        super().__init__(config)
        self.drain = drain

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.drain.begin()
        super().handle_exit(sig, frame)
