"""What a pull's worker thread reports, handed to the event loop that streams it.

Bounded whatever the client does: a :class:`~slm_server.pull.events.Progress` replaces
the one of the same file not yet taken (a slow reader sees fewer, later ones) and is
dropped when the hand-off is full; any other event waits for room (there are a few per
file: the plan, each file ready) unless the reader has gone, when it is dropped; the
end (the pull's result or its error) always goes in. The loop is woken once per batch,
not once per event.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from slm_server.pull.errors import PullError
from slm_server.pull.events import Event, Progress
from slm_server.pull.result import Pulled

End = Pulled | PullError
Item = Event | End

LIMIT = 64


class Handoff:
    """One pull's events, from its worker thread (:meth:`put`, :meth:`end`) to one
    reader on the event loop (:meth:`take`)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        limit: int = LIMIT,
        on_wait: Callable[[], None] | None = None,
    ) -> None:
        self._loop = loop
        self._limit = limit
        self._cond = threading.Condition()
        self._items: list[Item] = []
        self._progress_at: dict[str, int] = {}  # a file's Progress among _items
        self._signalled = False  # a wake-up is on its way to the loop
        self._closed = False  # the reader has gone
        self._wake = asyncio.Event()
        self._on_wait = on_wait  # told when put waits for room (for tests)

    # The worker's side.

    def put(self, event: Event) -> None:
        """Hand ``event`` over (from the worker thread); see the module docstring."""
        with self._cond:
            if self._closed:
                return
            if isinstance(event, Progress):
                at = self._progress_at.get(event.name)
                if at is not None:
                    self._items[at] = event
                    return
                if len(self._items) >= self._limit:
                    return
                self._progress_at[event.name] = len(self._items)
            else:
                while len(self._items) >= self._limit and not self._closed:
                    if self._on_wait is not None:
                        self._on_wait()
                    self._cond.wait()
                if self._closed:
                    return
            self._items.append(event)
            self._signal()

    def end(self, final: End) -> None:
        """The pull's result or its error: always the last item."""
        with self._cond:
            if self._closed:
                return
            self._items.append(final)
            self._signal()

    def _signal(self) -> None:
        if self._signalled:
            return
        self._signalled = True
        try:
            self._loop.call_soon_threadsafe(self._wake.set)
        except RuntimeError:  # the loop is closed: nobody reads any more
            self._closed = True

    # The reader's side (the event loop).

    @property
    def closed(self) -> bool:
        return self._closed

    def _batch(self) -> list[Item]:
        with self._cond:
            batch, self._items = self._items, []
            self._progress_at = {}
            self._signalled = False
            self._cond.notify_all()
            if not batch:
                self._wake.clear()
            return batch

    async def take(self, timeout: float | None = None) -> list[Item]:
        """Everything handed over since the last take, in order; waits for something,
        at most ``timeout`` seconds (then, or once closed, an empty list)."""
        while not self._closed:
            batch = self._batch()
            if batch:
                return batch
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except TimeoutError:
                return []
        return []

    def close(self) -> None:
        """The reader has gone: what is pending is dropped, a waiting :meth:`put`
        returns, and every later one drops its event (a waiting :meth:`take` returns)."""
        with self._cond:
            self._closed = True
            self._items = []
            self._progress_at = {}
            self._cond.notify_all()
        self._wake.set()


__all__ = ["End", "Handoff", "Item"]
