"""A flag that signal handlers set and the supervisor's loop reads.

Not a :class:`threading.Event`: its ``set`` takes a lock that is not re-entrant, and a
Python signal handler runs between any two bytecodes of the main thread, so a second
signal landing while the first handler was inside ``set`` waited for that lock forever
(``start.sh``'s Ctrl-C sends SIGINT to the process group and then SIGTERM: the launcher
hung with its backends alive). Setting and reading one attribute needs no lock: the
handlers run in the main thread, and the loop polls the flag every tick.
"""

from __future__ import annotations


class SignalFlag:
    """Raised by a signal handler, seen by the loop within a tick; safe to raise again
    from a handler that interrupted another."""

    __slots__ = ("_raised",)

    def __init__(self) -> None:
        self._raised = False

    def set(self) -> None:
        self._raised = True

    def clear(self) -> None:
        self._raised = False

    def is_set(self) -> bool:
        return self._raised


__all__ = ["SignalFlag"]
