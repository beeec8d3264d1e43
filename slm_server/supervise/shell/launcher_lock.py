"""One launcher per log directory.

Two ``backends`` launchers on one log directory would fight: the second takes the
first's backends for leftovers of a dead run (the pidfile names them) and stops them,
the first restarts them, the second finds them on its ports, and so on, each spending
its restart budget on working backends; the second also takes over the command socket
and the state file. So a launcher holds an exclusive ``flock`` on ``launcher.lock`` in
the log directory for its whole life, and a second one refuses to start while it is
held. The kernel releases the lock however the holder ends (``kill -9`` included), so
a stale file never blocks a start; the descriptor is not inherited by the backends, so
a backend that outlives its launcher does not hold it either. The file carries the
holder's pid, for the message. :func:`acquire` is the launcher's way in: the lock, or
the refusal reported.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from slm_server.contracts.events import EventSink

log = logging.getLogger("slm_server.supervisor")

LOCK_NAME = "launcher.lock"


@dataclass(frozen=True)
class Held:
    """The lock is another launcher's: ``holder`` is its pid when the file says it."""

    path: Path
    holder: int | None


class LauncherLock:
    """The lock, held until :meth:`release` or the process ends (``fd`` None: the
    file could not be had, and the launcher goes on without it)."""

    def __init__(self, path: Path, fd: int | None) -> None:
        self.path = path
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the lock
            self._fd = None


def take(log_dir: Path) -> LauncherLock | Held:
    """Take ``log_dir``'s launcher lock, or say who holds it. ``OSError`` when the
    file cannot be opened at all (the caller decides whether to go on without it)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    path = log_dir / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _pid_in(fd)
        os.close(fd)
        return Held(path, holder)
    except BaseException:
        os.close(fd)
        raise
    # Ours: say so in the file (a full disk only loses the pid in the message).
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return LauncherLock(path, fd)


def acquire(log_dir: Path, events: EventSink) -> LauncherLock | None:
    """This log directory's launcher lock; None when another launcher holds it
    (reported). A file that cannot be had at all (a read-only directory) is reported,
    and supervision goes on without the lock."""
    try:
        taken = take(log_dir)
    except OSError as exc:
        log.warning("cannot take the launcher lock in %s: %s", log_dir, exc)
        return LauncherLock(log_dir / LOCK_NAME, None)
    if isinstance(taken, Held):
        holder = f"pid {taken.holder}" if taken.holder is not None else "another process"
        log.error(
            "another launcher (%s) already supervises %s; stop it first, or give this "
            "one its own SLM_BACKEND_LOG_DIR",
            holder,
            log_dir,
        )
        events.emit("supervisor_refused", pid=os.getpid(), holder_pid=taken.holder, path=taken.path)
        return None
    return taken


def _pid_in(fd: int) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        text = os.pread(fd, 32, 0).decode("ascii").strip()
        pid = int(text)
        return pid if pid > 0 else None
    return None


__all__ = ["LOCK_NAME", "Held", "LauncherLock", "acquire", "take"]
