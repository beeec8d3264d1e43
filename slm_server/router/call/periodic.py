"""One task of the router's own that runs a turn again and again (the on-demand
planner, the memory pressure watch, following the registry the supervisor applied):
started on the running loop, stopped at shutdown, a failed turn logged and the next one
run all the same."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from slm_server.router.call.waits import cancel_and_wait, running_loop


class Periodic:
    """Runs ``turn`` until stopped; each turn answers how many seconds to wait before
    the next (``after_failure`` when it raised, which ``log`` is told as ``failure``).
    The first turn runs after ``first_wait`` seconds; where ``wakeable``, :meth:`wake`
    cuts a wait short (a plain sleep costs less, for the tasks no one wakes)."""

    def __init__(
        self,
        turn: Callable[[], Awaitable[float]],
        *,
        after_failure: Callable[[], float],
        log: logging.Logger,
        failure: str,
        first_wait: Callable[[], float] = lambda: 0.0,
        wakeable: bool = False,
    ) -> None:
        self.turn = turn
        self.after_failure = after_failure
        self.log = log
        self.failure = failure
        self.first_wait = first_wait
        self.wakeable = wakeable
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None

    def start(self) -> None:
        """Run on the current loop (nothing if already running)."""
        if self._task is None:
            self._wake = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._run(self._wake))

    async def stop(self) -> None:
        """Cancel the task and wait until it has ended."""
        task, self._task = self._task, None
        await cancel_and_wait(task)

    def wake(self) -> None:
        """Run the next turn now, not when the wait ends (where ``wakeable``)."""
        if self._wake is not None:
            self._wake.set()

    async def _run(self, wake: asyncio.Event) -> None:
        wait: float | None = self.first_wait() or None  # None: the first turn at once
        while True:
            if wait is not None and not self.wakeable:
                await asyncio.sleep(wait)
            elif wait is not None:
                # A timer rather than wait_for: on 3.11 wait_for can swallow a cancel
                # that arrives as the event is set, and the task would never stop.
                timer = running_loop().call_later(wait, wake.set)
                try:
                    await wake.wait()
                finally:
                    timer.cancel()
            wake.clear()
            try:
                wait = await self.turn()
            except Exception:  # one bad turn never ends the task for good
                self.log.exception("%s", self.failure)
                wait = self.after_failure()


__all__ = ["Periodic"]
