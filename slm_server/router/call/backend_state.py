"""The supervisor's published backend states, as the router sees them.

The state file's ``stat`` is taken at most every ``STAT_EVERY_SECONDS``, and the file
is read only when its inode, modification time or size changed, or while it is fresh
(modified less than ``FRESH_SECONDS`` ago), and decoded only when its bytes changed: so
looking a backend up (several times per request) costs next to nothing, and a change
is seen within that time. The supervisor replaces the file on every change; two
versions of the same size written within one tick of the file system's clock (a
jiffy, or a second on some) have the same stamp, so a fresh file's bytes are what
tell them apart.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Protocol

from slm_server.contracts.applied_registry import RegistryStamp, Retiring
from slm_server.contracts.records import BackendState, StateFile, parse_state, pid_alive
from slm_server.errors import BackendUnavailable

# How long a launcher whose pid and create time matched is trusted on its pid alone.
REVERIFY_SECONDS = 1.0
STAT_EVERY_SECONDS = 0.02
# How long a look :meth:`StateView.current` forces is trusted: a replica that stays
# refused (abandoned, ejected) is looked at again at most this often, not per request.
CURRENT_WITHIN_SECONDS = 0.001
# Longer than the coarsest modification-time tick of the file systems we run on (1 s).
FRESH_SECONDS = 2.0


def given_up(subject: str, state: BackendState) -> BackendUnavailable | None:
    """503, with why, when the supervisor has given up on the backend ``subject`` names
    (abandoned by the watchdog, or failed: no process, and none until the supervisor
    starts again); None in any other state."""
    if state.state not in ("abandoned", "failed"):
        return None
    verb = "was abandoned by the watchdog" if state.state == "abandoned" else "failed"
    return BackendUnavailable(
        f"{subject} {verb}: {state.reason or 'no reason recorded'}",
        code=f"backend_{state.state}",
    )


def awaits_reload(state: BackendState) -> bool:
    """Whether requests wait for this backend rather than being refused: a reload
    added or replaced it and it is starting (see
    :mod:`~slm_server.router.reload.readiness`)."""
    return state.reloaded and state.state == "starting"


def comes_back(state: BackendState) -> bool:
    """Whether the supervisor is (re)starting this backend and will publish it ready,
    or give it up: requests for it wait rather than being refused (see
    :mod:`~slm_server.router.reload.readiness`)."""
    return state.state in COMING_BACK


# The states a backend comes back from: its process is starting, or is to be started
# again after an exit or a confirmed trip (the restart budget allowing).
COMING_BACK = frozenset({"starting", "restarting"})


class StateSource(Protocol):
    """The supervisor's published states as the router reads them: :class:`StateView`
    over the state file in production."""

    def get(self, role: str, port: int) -> BackendState | None:
        """The published state of the backend with this role and port, if any."""
        ...

    def current(self, role: str, port: int) -> BackendState | None:
        """As :meth:`get`, read from the file now rather than up to
        ``STAT_EVERY_SECONDS`` ago: asked before a request is refused."""
        ...

    def planned(self, role: str, port: int) -> BackendState | None:
        """What a running launcher published for this backend; None without one."""
        ...

    def launcher_alive(self) -> bool:
        """Whether the process that published the states still runs."""
        ...

    def stamp(self) -> RegistryStamp | None:
        """The registry the launcher applied, as it published it; None when it said
        nothing of one."""
        ...

    def retiring(self) -> list[Retiring]:
        """The backends a reload retires, draining until their processes are gone."""
        ...


class StateView:
    """Read-through cache of ``backends.state.json``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen: tuple[int, int, int] | None = None
        self._raw: bytes | None = None
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
            seen = (info.st_ino, info.st_mtime_ns, info.st_size)
            fresh = time.time_ns() - info.st_mtime_ns < FRESH_SECONDS * 1e9
            if seen == self._seen and not fresh:
                return
            raw = self.path.read_bytes()
        except OSError:
            self._seen, self._raw, self._states, self._file = None, None, {}, StateFile()
            return
        self._seen = seen
        if raw == self._raw:
            return
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError):
            data = None  # half of a file no writer of ours leaves: as if empty
        self._raw, self._file = raw, parse_state(data)
        self._verified_until = 0.0
        self._states = {(s.role, s.port): s for s in self._file.backends}

    def get(self, role: str, port: int) -> BackendState | None:
        """The published state of the backend with this role and port, if any."""
        self._refresh()
        return self._states.get((role, port))

    def current(self, role: str, port: int) -> BackendState | None:
        """The published state of the backend read now (a stat, and a read when the
        file changed), not up to ``STAT_EVERY_SECONDS`` ago: at most
        ``CURRENT_WITHIN_SECONDS`` ago."""
        looked_at = self._stat_after - STAT_EVERY_SECONDS
        self._stat_after = min(self._stat_after, looked_at + CURRENT_WITHIN_SECONDS)
        return self.get(role, port)

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

    def stamp(self) -> RegistryStamp | None:
        """The registry the launcher applied, as the state file names it."""
        self._refresh()
        return self._file.registry

    def retiring(self) -> list[Retiring]:
        """The backends a reload retires, as the state file lists them."""
        self._refresh()
        return self._file.retiring
