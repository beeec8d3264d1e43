"""Admission control per backend: at most ``max_concurrency`` requests in flight, up to
``max_queue`` more waiting in FIFO order, the rest refused at once. A paused gate (a
model being unloaded, or drained to make room) admits nobody: requests queue, within
the same limits, until it is resumed.

A refusal (queue full) and a deadline that passes while queued are the router's own
decisions, never evidence against the backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable

from slm_server.errors import BackendTimeout, Overloaded

RETRY_AFTER_SECONDS = 1.0


class Gate:
    """A FIFO semaphore with a bounded queue for one backend."""

    def __init__(
        self,
        name: str,
        limit: int,
        max_queue: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.limit = limit
        self.max_queue = max_queue
        self.active = 0
        self.paused = False
        self.clock = clock
        self.last_release = clock()  # when a request last finished (or the gate was made)
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def queued(self) -> int:
        return sum(1 for w in self._waiters if not w.done())

    def try_acquire(self) -> bool:
        """Take a slot if one is free and nobody waits; never waits."""
        if self.active < self.limit and not self._waiters and not self.paused:
            self.active += 1
            return True
        return False

    @property
    def idle(self) -> bool:
        """Nothing in flight and nothing waiting."""
        return self.active == 0 and self.queued == 0

    def pause(self) -> None:
        """Admit nobody until :meth:`resume`; what is in flight goes on."""
        self.paused = True

    def resume(self) -> None:
        """Admit again: waiters take the free slots in order."""
        self.paused = False
        while self.active < self.limit and self._grant():
            self.active += 1

    def resize(self, name: str, limit: int, max_queue: int) -> None:
        """Take a reloaded registry's limits, dropping nobody: a larger ``limit``
        admits waiters at once; with a smaller one the requests in flight finish and
        no waiter is admitted until fewer than ``limit`` are; a smaller ``max_queue``
        refuses newcomers until the line is shorter than it."""
        self.name = name
        self.limit = limit
        self.max_queue = max_queue
        if not self.paused:
            while self.active < self.limit and self._grant():
                self.active += 1

    def _grant(self) -> bool:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return True
        return False

    async def acquire(
        self, timeout: float, placed: Callable[[Callable[[], int]], None] | None = None
    ) -> None:
        """Take a slot, waiting up to ``timeout`` seconds in line (``placed`` is handed
        what tells the waiters ahead of this one, once it waits); raises
        :class:`Overloaded` when the line is full, :class:`BackendTimeout` when the
        deadline passes first."""
        if self.try_acquire():
            return
        if self.queued >= self.max_queue:
            raise Overloaded(
                f"The backend for '{self.name}' is busy: {self.active} requests in flight "
                f"and {self.queued} waiting (max_queue {self.max_queue}); retry shortly",
                retry_after=RETRY_AFTER_SECONDS,
            )
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        if placed is not None:
            placed(lambda: self._ahead(waiter))
        try:
            await asyncio.wait_for(asyncio.shield(waiter), timeout)
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled():
                self.release()  # granted just as we gave up: pass the slot on
            else:
                waiter.cancel()
                self._forget(waiter)
            if isinstance(exc, TimeoutError):
                raise BackendTimeout(
                    f"The request for '{self.name}' waited {timeout:.3g}s in the queue and "
                    "reached its deadline before a slot was free",
                    code="deadline_exceeded_in_queue",
                ) from None
            raise

    def _ahead(self, waiter: asyncio.Future[None]) -> int:
        """How many live waiters are ahead of ``waiter`` (asked when reported)."""
        ahead = 0
        for other in self._waiters:
            if other is waiter:
                return ahead
            ahead += not other.done()
        return 0

    def _forget(self, waiter: asyncio.Future[None]) -> None:
        with contextlib.suppress(ValueError):
            self._waiters.remove(waiter)

    def release(self) -> None:
        """Free a slot: the oldest live waiter gets it (unless paused, or more are in
        flight than a smaller limit allows), else the count drops."""
        self.last_release = self.clock()
        if not self.paused and self.active <= self.limit and self._grant():
            return
        self.active = max(0, self.active - 1)


class Slot:
    """An admission slot, released exactly once."""

    def __init__(self, gate: Gate) -> None:
        self._gate: Gate | None = gate

    def release(self) -> None:
        if self._gate is not None:
            self._gate.release()
            self._gate = None
