"""Reading the ends of log files without trusting their size or their lines.

:class:`Follower` follows one append-only file (``logs/watchdog.jsonl``) the way
``tail -F`` does: first its last lines, then whatever is appended, read from where it
left off in chunks of at most ``CHUNK_BYTES``. When the file is replaced (renamed to
``.prev`` and recreated) or truncated in place (the log trimmer copies it to ``.prev``
and truncates it), reading starts again from its beginning. A file is known again by
its inode, and by its first ``HEAD_BYTES`` (kept as read): a file truncated and written
again, or deleted and made again with the old one's inode number (ext4 often gives
it), before a look has seen it shorter, no longer begins as it did. A line longer than
``MAX_LINE_BYTES`` is cut there and the rest of it skipped, so one hostile line costs a
bounded amount of memory. :func:`last_lines` reads the end of a file once, bounded the
same way. Only a regular file is read: anything else in its place (a named pipe, whose
``open`` would wait for a writer) is as an empty file. Both are blocking calls, meant
for a worker thread; :meth:`Follower.unchanged` is one ``stat``, for the caller to skip
a poll that would find nothing: its size, inode and modification time as last read.
"""

from __future__ import annotations

import contextlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Final, NamedTuple

CHUNK_BYTES: Final = 64 * 1024
MAX_LINE_BYTES: Final = 8 * 1024
TAIL_BYTES: Final = 256 * 1024  # how far back from the end the last lines are looked for
HEAD_BYTES: Final = 256  # a file's first bytes, by which it is known again


@dataclass(frozen=True)
class Line:
    """One line, decoded (invalid UTF-8 replaced); ``cut`` when it was longer than kept."""

    text: str
    cut: bool = False


def _line(raw: bytes, cut: bool = False) -> Line:
    if len(raw) > MAX_LINE_BYTES:
        raw, cut = raw[:MAX_LINE_BYTES], True
    return Line(raw.rstrip(b"\r").decode("utf-8", "replace"), cut)


def _open_file(path: Path) -> BinaryIO | None:
    """``path`` opened to read, when it is a regular file; None for anything else (a
    named pipe's ``open`` would wait for a writer, its reads for data). Raises
    ``OSError`` when it cannot be opened."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # no effect on a regular file's reads
    try:
        regular = stat.S_ISREG(os.fstat(fd).st_mode)
    except OSError:
        os.close(fd)
        raise
    if not regular:
        os.close(fd)
        return None
    return os.fdopen(fd, "rb")


def _head(handle: BinaryIO) -> bytes:
    """The first ``HEAD_BYTES`` of an open file (fewer when it is shorter)."""
    handle.seek(0)
    return handle.read(HEAD_BYTES)


class _End(NamedTuple):
    """The end of a file as read: its last lines' bytes (from a line start), the offset
    they end at, and the file's inode, modification time and first bytes."""

    data: bytes
    end: int
    inode: int
    mtime_ns: int
    head: bytes


def _read_end(path: Path, max_bytes: int) -> _End | None:
    """The last ``max_bytes`` of ``path`` from a line start, and what knows it again."""
    try:
        handle = _open_file(path)
        if handle is None:
            return None
        with handle:
            info = os.fstat(handle.fileno())
            head = _head(handle)
            start = max(0, info.st_size - max_bytes)
            handle.seek(start)
            data = handle.read(info.st_size - start)
    except OSError:
        return None
    end = start + len(data)
    if start > 0:  # begin after the first newline: the line before it is cut
        newline = data.find(b"\n")
        data = data[newline + 1 :] if newline >= 0 else b""
    return _End(data, end, info.st_ino, info.st_mtime_ns, head)


def last_lines(path: Path, count: int, max_bytes: int = TAIL_BYTES) -> list[Line] | None:
    """The last ``count`` complete or partial lines of ``path``, looking back at most
    ``max_bytes``; None when it cannot be read."""
    found = _read_end(path, max_bytes)
    if found is None:
        return None
    parts = found.data.split(b"\n")
    if parts and parts[-1] == b"":
        parts.pop()
    return [_line(raw) for raw in parts[-count:]] if count > 0 else []


class Follower:
    """Reads one file's new lines incrementally; see the module docstring."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.inode: int | None = None
        self.mtime_ns: int | None = None  # the file's modification time as last read
        self.head = b""  # the file's first bytes (at most HEAD_BYTES) as last read
        self.partial = b""
        self.skipping = False  # inside a line already cut at MAX_LINE_BYTES
        self.behind = False  # the last poll read a full chunk: more may be waiting

    def start(self, count: int) -> list[Line]:
        """The last ``count`` lines now in the file; following starts after them."""
        found = _read_end(self.path, TAIL_BYTES)
        if found is None:
            return []
        data, self.offset, self.inode, self.mtime_ns, self.head = found
        # The end of the file may be a line still being written: keep it for later.
        complete, _, self.partial = data.rpartition(b"\n")
        if len(self.partial) > MAX_LINE_BYTES:
            self.partial, self.skipping = b"", True
        lines = complete.split(b"\n") if complete else []
        return [_line(raw) for raw in lines[-count:]] if count > 0 else []

    def unchanged(self) -> bool:
        """True when the file is the one followed and has grown by nothing and been
        written to by no one: one ``stat``, cheap enough for the event loop, that spares
        a worker thread the poll."""
        try:
            info = os.stat(self.path)
        except OSError:
            return True  # gone for now: nothing to read
        return (
            not self.behind
            and info.st_ino == self.inode
            and info.st_size == self.offset
            and info.st_mtime_ns == self.mtime_ns
        )

    def _reset(self, info: os.stat_result) -> None:
        """Following the file ``info`` describes from its start."""
        self.offset, self.inode, self.partial, self.skipping = 0, info.st_ino, b"", False
        self.mtime_ns, self.head = info.st_mtime_ns, b""

    def poll(self) -> list[Line]:
        """The complete lines appended since the last call (reading at most
        ``CHUNK_BYTES``); starts over on a replaced or truncated file, or one that no
        longer begins as it did."""
        try:
            handle = _open_file(self.path)
        except OSError:
            return []  # gone for now (between a rename and the next write)
        self.behind = False
        if handle is None:  # not a file: nothing to read, and nothing until it changes
            with contextlib.suppress(OSError):
                self._reset(os.stat(self.path))
            return []
        with handle:
            info = os.fstat(handle.fileno())
            head = _head(handle)
            if (
                info.st_ino != self.inode
                or info.st_size < self.offset
                or head[: len(self.head)] != self.head
            ):
                self._reset(info)
            self.mtime_ns, self.head = info.st_mtime_ns, head
            if info.st_size == self.offset:
                return []
            handle.seek(self.offset)
            data = handle.read(CHUNK_BYTES)
        self.offset += len(data)
        self.behind = len(data) == CHUNK_BYTES
        return self._split(data)

    def _split(self, data: bytes) -> list[Line]:
        lines: list[Line] = []
        start = 0
        while True:
            newline = data.find(b"\n", start)
            if newline < 0:
                break
            if self.skipping:
                lines.append(_line(self.partial, cut=True))
                self.skipping = False
            else:
                lines.append(_line(self.partial + data[start:newline]))
            self.partial = b""
            start = newline + 1
        rest = data[start:]
        if self.skipping:
            return lines
        if len(self.partial) + len(rest) > MAX_LINE_BYTES:
            self.partial = (self.partial + rest)[:MAX_LINE_BYTES]
            self.skipping = True
        else:
            self.partial += rest
        return lines


__all__ = ["CHUNK_BYTES", "HEAD_BYTES", "MAX_LINE_BYTES", "Follower", "Line", "last_lines"]
