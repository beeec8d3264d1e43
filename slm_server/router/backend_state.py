"""The supervisor's published backend states, as the router sees them.

The state file is re-read only when its modification time changes, so looking a
backend up on every request costs one ``stat``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from slm_server.launch.records import BackendState, launcher_running, read_launcher, read_state

# How long a launcher whose pid and create time matched is trusted on its pid alone.
REVERIFY_SECONDS = 1.0


class StateView:
    """Read-through cache of ``backends.state.json``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._states: dict[tuple[str, int], BackendState] = {}
        self._launcher: tuple[int | None, float | None] = (None, None)
        self._verified_until = 0.0

    def _refresh(self) -> None:
        try:
            info = os.stat(self.path)
        except OSError:
            self._stamp, self._states, self._launcher = None, {}, (None, None)
            return
        stamp = (info.st_mtime_ns, info.st_size)
        if stamp == self._stamp:
            return
        _pid, states = read_state(self.path)
        self._stamp, self._launcher = stamp, read_launcher(self.path)
        self._verified_until = 0.0
        self._states = {(s.role, s.port): s for s in states}

    def get(self, role: str, port: int) -> BackendState | None:
        """The published state of the backend with this role and port, if any."""
        self._refresh()
        return self._states.get((role, port))

    def launcher_alive(self) -> bool:
        """Whether the process that published the states still runs (a dead launcher's
        file describes nothing, nor does one whose pid another process now has)."""
        self._refresh()
        pid, _created = self._launcher
        now = time.monotonic()
        if pid is not None and now < self._verified_until:
            # Verified a moment ago: a signal-0 check is enough in between (it is on the
            # path of every request; reading the create time costs a /proc read).
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return False
            except PermissionError:
                return True
            return True
        alive = launcher_running(*self._launcher)
        self._verified_until = now + REVERIFY_SECONDS if alive else 0.0
        return alive
