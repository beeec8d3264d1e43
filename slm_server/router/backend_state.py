"""The supervisor's published backend states, as the router sees them.

The state file is re-read only when its modification time changes, so looking a
backend up on every request costs one ``stat``.
"""

from __future__ import annotations

import os
from pathlib import Path

from slm_server.launch.records import BackendState, read_state


class StateView:
    """Read-through cache of ``backends.state.json``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._states: dict[tuple[str, int], BackendState] = {}
        self._launcher: int | None = None

    def _refresh(self) -> None:
        try:
            info = os.stat(self.path)
        except OSError:
            self._stamp, self._states, self._launcher = None, {}, None
            return
        stamp = (info.st_mtime_ns, info.st_size)
        if stamp == self._stamp:
            return
        pid, states = read_state(self.path)
        self._stamp, self._launcher = stamp, pid
        self._states = {(s.role, s.port): s for s in states}

    def get(self, role: str, port: int) -> BackendState | None:
        """The published state of the backend with this role and port, if any."""
        self._refresh()
        return self._states.get((role, port))

    def launcher_alive(self) -> bool:
        """Whether the process that published the states still runs (a dead launcher's
        file describes nothing)."""
        self._refresh()
        if self._launcher is None:
            return False
        try:
            os.kill(self._launcher, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
