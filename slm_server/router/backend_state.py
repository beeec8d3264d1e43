"""The supervisor's published backend states, as the router sees them.

The state file is re-read only when its modification time changes, and its ``stat``
is taken at most every ``STAT_EVERY_SECONDS``, so looking a backend up (several times
per request) costs next to nothing; a change is seen within that time.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Protocol

from slm_server.records import BackendState, StateFile, pid_alive, read_state_file

# How long a launcher whose pid and create time matched is trusted on its pid alone.
REVERIFY_SECONDS = 1.0
STAT_EVERY_SECONDS = 0.02


class StateSource(Protocol):
    """The supervisor's published states as the router reads them: :class:`StateView`
    over the state file in production."""

    def get(self, role: str, port: int) -> BackendState | None:
        """The published state of the backend with this role and port, if any."""
        ...

    def planned(self, role: str, port: int) -> BackendState | None:
        """What a running launcher published for this backend; None without one."""
        ...

    def launcher_alive(self) -> bool:
        """Whether the process that published the states still runs."""
        ...


class StateView:
    """Read-through cache of ``backends.state.json``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._states: dict[tuple[str, int], BackendState] = {}
        self._file = StateFile()
        self._verified_until = 0.0
        self._stat_after = 0.0

    def _refresh(self) -> None:
        now = time.monotonic()
        if now < self._stat_after:
            return
        self._stat_after = now + STAT_EVERY_SECONDS
        try:
            info = os.stat(self.path)
        except OSError:
            self._stamp, self._states, self._file = None, {}, StateFile()
            return
        stamp = (info.st_mtime_ns, info.st_size)
        if stamp == self._stamp:
            return
        self._stamp, self._file = stamp, read_state_file(self.path)
        self._verified_until = 0.0
        self._states = {(s.role, s.port): s for s in self._file.backends}

    def get(self, role: str, port: int) -> BackendState | None:
        """The published state of the backend with this role and port, if any."""
        self._refresh()
        return self._states.get((role, port))

    def planned(self, role: str, port: int) -> BackendState | None:
        """What a running launcher published for this backend (its kind, health path
        and request defaults); None without one."""
        state = self.get(role, port)
        return state if state is not None and self.launcher_alive() else None

    def launcher_alive(self) -> bool:
        """Whether the process that published the states still runs (a dead launcher's
        file describes nothing, nor does one whose pid another process now has)."""
        self._refresh()
        now = time.monotonic()
        if now < self._verified_until:
            # Verified a moment ago: a signal-0 check is enough in between (it is on the
            # path of every request; reading the create time costs a /proc read).
            return pid_alive(self._file.launcher_pid)
        alive = self._file.launcher_running()
        self._verified_until = now + REVERIFY_SECONDS if alive else 0.0
        return alive
