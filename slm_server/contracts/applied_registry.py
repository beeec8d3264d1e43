"""The registry in force: the one the supervisor applied, which the router routes by.

The supervisor validates a registry (at start, and on each reload), applies it, and
publishes it in two steps: first its exact text as a snapshot beside the logs
(:data:`SNAPSHOT_NAME`), then a :class:`RegistryStamp` naming that text's version in
the state file. The router follows the stamp, not the file on disk: it reads the
snapshot, checks that its text has the stamped version, and only then routes by it.
So a router and a supervisor that restart independently agree on one registry, and no
request is routed by a registry the supervisor has not applied; an edit to the file
that nobody reloaded changes nothing until a reload (or a restart of the supervisor).

A backend that a reload removed or replaced is published as :class:`Retiring` until
its process is gone: the router stops admitting to it, and tells the supervisor when
nothing is in flight on it any more (the ``retired`` command), or the supervisor stops
it at its ``deadline`` (the drain timeout) whatever is still in flight.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

SNAPSHOT_NAME = "registry.applied.yaml"
# A snapshot larger than this is not read back (a registry is a few kilobytes).
MAX_SNAPSHOT_BYTES = 4 * 1024 * 1024
RetireReason = Literal["removed", "replaced"]


def version_of(text: str) -> str:
    """A registry text's version: the first 16 hex digits of its SHA-256."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class RegistryStamp:
    """Which registry is in force: its ``version`` (:func:`version_of` its text), how
    many registries this supervisor has applied (``generation``, 1 at start), when it
    was applied (wall clock) and the file it was read from."""

    version: str
    generation: int
    loaded_at: float
    path: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: Any) -> RegistryStamp | None:
        """The stamp in a state file, None when absent or malformed."""
        if not isinstance(raw, dict):
            return None
        version, generation = raw.get("version"), raw.get("generation")
        loaded_at, path = raw.get("loaded_at"), raw.get("path")
        if not isinstance(version, str) or len(version) != 16:
            return None
        if not isinstance(generation, int) or isinstance(generation, bool) or generation < 1:
            return None
        if not isinstance(loaded_at, int | float) or not isinstance(path, str):
            return None
        return cls(version, generation, float(loaded_at), path)


@dataclass(frozen=True)
class Retiring:
    """A backend a reload removed (or replaced with a new launch), draining until its
    process is gone: its ``role``, ``port`` and ``pid``, since when (wall clock), and
    the ``deadline`` (wall clock) after which it is stopped whatever is in flight."""

    role: str
    model_id: str
    port: int
    pid: int
    reason: RetireReason
    since: float
    deadline: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: Any) -> Retiring | None:
        if not isinstance(raw, dict):
            return None
        try:
            role, model_id, reason = raw["role"], raw["model_id"], raw["reason"]
            port, pid = raw["port"], raw["pid"]
            since, deadline = float(raw["since"]), float(raw["deadline"])
        except (KeyError, TypeError, ValueError):
            return None
        if not isinstance(role, str) or not isinstance(model_id, str):
            return None
        if reason not in ("removed", "replaced"):
            return None
        if not isinstance(port, int) or not isinstance(pid, int) or pid <= 0:
            return None
        return cls(role, model_id, port, pid, reason, since, deadline)


def snapshot_path(log_dir: Path) -> Path:
    return log_dir / SNAPSHOT_NAME


def write_snapshot(log_dir: Path, text: str) -> None:
    """Write the applied registry's text (temp file + rename, mode 0600)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    path = snapshot_path(log_dir)
    fd, tmp = tempfile.mkstemp(prefix=f".{SNAPSHOT_NAME}.", dir=log_dir)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_snapshot(log_dir: Path, version: str) -> str | None:
    """The applied registry's text if the snapshot holds the registry of ``version``;
    None when it is missing, too large, unreadable or of another version (a newer
    reload wrote it after the stamp was read, or it was forged)."""
    path = snapshot_path(log_dir)
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_SNAPSHOT_BYTES + 1)
    except OSError:
        return None
    if len(raw) > MAX_SNAPSHOT_BYTES:
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return text if version_of(text) == version else None


__all__ = [
    "SNAPSHOT_NAME",
    "RegistryStamp",
    "Retiring",
    "read_snapshot",
    "snapshot_path",
    "version_of",
    "write_snapshot",
]
