"""One timer for whichever deadline is current, moved only when a deadline comes
sooner than the one it is set for.

    alarm = Alarm(loop)
    alarm.set(10.0, on_late)     # on_late() runs 10 s from now, unless...
    alarm.set(75.0, on_idle)     # ...replaced: no timer is moved, on_idle() in 75 s
    alarm.clear()                # nothing runs

A connection's door has one deadline at a time (the head's, the body's or the idle
one) and changes it several times per request; cancelling and scheduling an event-loop
timer each time costs more than the request's own work. Here a change that pushes the
deadline later only notes it: the timer, when it fires early, sets itself for the
deadline then current.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final

# Timers may fire this early; a deadline this close has passed.
SLACK: Final = 0.001


class Alarm:
    """See the module docstring. ``action`` is the callback of the current deadline."""

    __slots__ = ("_armed_at", "_deadline", "_handle", "_loop", "action")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._handle: asyncio.TimerHandle | None = None
        self._armed_at = 0.0
        self._deadline = 0.0
        self.action: Callable[[], None] | None = None

    def set(self, seconds: float, action: Callable[[], None]) -> None:
        """Run ``action`` ``seconds`` from now, in place of any earlier deadline."""
        deadline = self._loop.time() + seconds
        self._deadline, self.action = deadline, action
        handle = self._handle
        if handle is None or self._armed_at > deadline:
            if handle is not None:
                handle.cancel()
            self._arm(deadline)

    def clear(self) -> None:
        """No deadline (the timer, if set, fires and does nothing)."""
        self.action = None

    def cancel(self) -> None:
        """No deadline and no timer: the alarm is done with."""
        self.action = None
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _arm(self, when: float) -> None:
        self._armed_at = when
        self._handle = self._loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self._handle = None
        action = self.action
        if action is None:
            return
        if self._loop.time() + SLACK < self._deadline:
            self._arm(self._deadline)
            return
        self.action = None
        action()
