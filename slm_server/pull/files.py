"""The files on this side: where a pull stages and puts them, whether one is already
there, the free space, and the move that makes a checked file visible under its name."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

from slm_server.pull.errors import PullError

STAGING: Final = ".pull"  # hidden: `models` and discovery never list what is in it
_CHUNK: Final = 1 << 20
SPACE_MARGIN_BYTES: Final = 1 << 20


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def within(root: Path, relative: str) -> Path:
    """``root / relative``, refused when it would land outside ``root`` (a symlink
    planted inside it, say)."""
    target = root / relative
    base = root.resolve()
    resolved = target.resolve()
    if resolved != base and base not in resolved.parents:
        raise PullError("unsafe_name", f"refused {relative!r}: it resolves outside {root}")
    return target


def already_there(path: Path, size: int, sha256: str | None) -> bool:
    """The file is there with the expected size and, when known, SHA-256."""
    try:
        if not path.is_file() or path.stat().st_size != size:
            return False
        return sha256 is None or sha256_of(path) == sha256
    except OSError:
        return False


def free_bytes(folder: Path) -> int:
    """Free space where ``folder`` is (or its nearest existing parent)."""
    for candidate in (folder, *folder.parents):
        try:
            return shutil.disk_usage(candidate).free
        except OSError:
            continue
    return 0


def check_space(folder: Path, needed: int) -> int:
    """The free bytes at ``folder``; raises ``no_space`` when ``needed`` does not fit."""
    free = free_bytes(folder)
    if needed + SPACE_MARGIN_BYTES > free:
        raise PullError(
            "no_space",
            f"not enough disk space in {folder}: {needed / 1e6:.1f} MB to fetch, "
            f"{free / 1e6:.1f} MB free; nothing was fetched (set SLM_MODELS_DIR elsewhere)",
        )
    return free


def no_space(exc: OSError, folder: Path) -> PullError | None:
    """The error to raise for a write that found the disk full, else None."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return PullError(
            "no_space", f"the disk filled while writing into {folder}: the partial file was removed"
        )
    return None


def verify(path: Path, size: int, sha256: str | None, name: str) -> None:
    """Raise ``checksum`` (after removing ``path``) unless it has the hub's size and
    SHA-256."""
    actual_size = path.stat().st_size
    if actual_size != size:
        path.unlink(missing_ok=True)
        raise PullError(
            "checksum", f"{name}: {actual_size} bytes arrived, the hub says {size}; not kept"
        )
    if sha256 is not None:
        actual = sha256_of(path)
        if actual != sha256:
            path.unlink(missing_ok=True)
            raise PullError(
                "checksum",
                f"{name}: SHA-256 {actual} is not the hub's {sha256}; not kept, nothing was "
                "put under its name",
            )


def move_into_place(staged: Path, final: Path) -> None:
    """Rename the checked file to its final name (same filesystem: atomic), and make
    the rename durable."""
    final.parent.mkdir(parents=True, exist_ok=True)
    os.replace(staged, final)
    try:
        descriptor = os.open(final.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


@contextmanager
def exclusive(partial: Path, name: str) -> Iterator[None]:
    """Hold ``partial``'s lock (a ``.lock`` beside it) for the block: another pull, in
    this process or another, writing the same partial file is refused, not interleaved."""
    lock = partial.with_name(partial.name + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise PullError(
                "in_progress", f"{name}: another pull is fetching the same file; try again after it"
            ) from None
        yield
    finally:
        os.close(descriptor)


def tidy(staging: Path, root: Path) -> None:
    """After a pull: remove ``staging`` unless an unfinished download is in it (another
    pull's, kept to resume), then its empty parents up to ``root``."""
    try:
        unfinished = any(
            p.name.endswith((".incomplete", ".partial")) for p in staging.rglob("*") if p.is_file()
        )
    except OSError:
        return
    if unfinished:
        return
    shutil.rmtree(staging, ignore_errors=True)
    for parent in staging.parents:
        if parent == root or root not in parent.parents:
            break
        try:
            parent.rmdir()
        except OSError:
            break


__all__ = [
    "SPACE_MARGIN_BYTES",
    "STAGING",
    "already_there",
    "check_space",
    "exclusive",
    "free_bytes",
    "move_into_place",
    "no_space",
    "sha256_of",
    "tidy",
    "verify",
    "within",
]
