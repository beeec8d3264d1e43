"""Watching the registry file (``SLM_CONFIG_WATCH``): a reload once a change has
settled. Pure apart from the ``stat`` it is given.

The file is looked at each turn of the supervisor's loop. A change (its inode, size or
modification time) starts the settle timer and each further change restarts it; once
the file has stayed the same for ``settle_seconds`` the watch says "reload", once. An
editor that saves by writing a new file and renaming it, or in several writes, makes
one reload, not one per write. A file that vanishes is a change too, reported when it
settles (the reload then refuses it, naming the problem).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

Stamp = tuple[int, int, int] | None


def file_stamp(path: Path) -> Stamp:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_ino, info.st_size, info.st_mtime_ns)


class ConfigWatch:
    """Says when the file at ``path`` changed and then stayed unchanged for
    ``settle_seconds`` (``now``: monotonic seconds)."""

    def __init__(
        self,
        path: Path,
        settle_seconds: float,
        stamp: Callable[[Path], Stamp] = file_stamp,
    ) -> None:
        self.path = path
        self.settle_seconds = settle_seconds
        self.stamp_of = stamp
        self.seen = stamp(path)
        self.changed_at: float | None = None

    def due(self, now: float) -> bool:
        """Whether a settled change calls for a reload now (at most once per change)."""
        current = self.stamp_of(self.path)
        if current != self.seen:
            self.seen = current
            self.changed_at = now
            return False
        if self.changed_at is not None and now - self.changed_at >= self.settle_seconds:
            self.changed_at = None
            return True
        return False


__all__ = ["ConfigWatch", "file_stamp"]
