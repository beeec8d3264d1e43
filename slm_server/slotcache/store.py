"""The directory of saved slots: private, bounded, and never trusted blindly.

Layout (``SLM_SLOT_CACHE_DIR``, mode 0700; every file 0600, since a slot holds the
text of its prompts)::

    <key>.slot<N>.bin   what llama-server wrote for slot N (``/slots/N?action=save``)
    <key>.json          the manifest: format, key, role, model id, when, and for each
                        slot its file, tokens and bytes

A saved set is used only through its manifest, and only when the manifest names the
expected key and every file it lists is a regular file of ours of exactly the recorded
size; anything else is refused (and removed) with the reason. A model's sets are
replaced, not accumulated: committing a set drops the other sets of the same role
and model. Beyond the disk budget the least recently saved or restored sets go first;
a set larger than the whole budget is not kept.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

FORMAT: Final = 1
MIB: Final = 1 << 20
MANIFEST_MAX_BYTES: Final = 64 * 1024
_KEY = re.compile(r"^[0-9a-f]{8,64}$")
_OURS = re.compile(r"^([0-9a-f]{8,64})(?:\.slot\d+\.bin|\.json|\.json\.tmp)$")


@dataclass(frozen=True)
class SavedSlot:
    slot: int
    file: str
    tokens: int
    bytes: int


@dataclass(frozen=True)
class SavedSet:
    """A usable saved set: its key and its slots."""

    key: str
    role: str
    model_id: str
    saved_at: float
    slots: tuple[SavedSlot, ...]

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.slots)

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.slots)


@dataclass(frozen=True)
class Refused:
    """A saved set that is not used, and why."""

    key: str
    reason: str


def slot_file(key: str, slot: int) -> str:
    """The file name a slot of ``key`` is saved under (a plain name, as the server's
    filename check wants)."""
    if not _KEY.match(key):
        raise ValueError(f"not a cache key: {key!r}")
    return f"{key}.slot{slot}.bin"


def _ours(path: Path) -> os.stat_result | None:
    """The file's status when it is a regular file (not a link) owned by us."""
    try:
        status = path.lstat()
    except OSError:
        return None
    if not stat.S_ISREG(status.st_mode) or status.st_uid != os.getuid():
        return None
    return status


def _remove(path: Path) -> bool:
    """Unlink a file or link named like ours; a directory (never ours) is left."""
    try:
        if stat.S_ISDIR(path.lstat().st_mode):
            return False
        path.unlink()
    except FileNotFoundError:
        return False
    return True


class SlotStore:
    def __init__(self, directory: Path, budget_mb: int) -> None:
        self.directory = directory
        self.budget_bytes = budget_mb * MIB

    def prepare(self) -> None:
        """Create the directory, private to us (raises :class:`OSError`)."""
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.directory, 0o700)

    def _manifest(self, key: str) -> Path:
        return self.directory / f"{key}.json"

    def _read(self, key: str) -> dict[str, Any] | str:
        path = self._manifest(key)
        status = _ours(path)
        if status is None:
            return "no manifest of ours" if path.exists() or path.is_symlink() else ""
        if status.st_size > MANIFEST_MAX_BYTES:
            return f"manifest of {status.st_size} bytes"
        try:
            data = json.loads(path.read_bytes())
        except (OSError, ValueError, RecursionError) as exc:  # too deep is corrupt too
            return f"unreadable manifest: {exc}"
        return data if isinstance(data, dict) else "manifest is not an object"

    def saved(self, key: str, slots: int) -> SavedSet | Refused | None:
        """The set saved under ``key`` for a server of ``slots`` slots; None when there
        is none; :class:`Refused` when there is one that must not be used."""
        data = self._read(key)
        if data == "":
            return None
        if isinstance(data, str):
            return Refused(key, data)
        form = data.get("format")
        if not isinstance(form, int) or isinstance(form, bool) or form != FORMAT:
            return Refused(key, "manifest of another format")
        if data.get("key") != key:
            return Refused(key, "manifest of another key")
        found: list[SavedSlot] = []
        listed = data.get("slots")
        for raw in listed if isinstance(listed, list) else []:
            item = _slot(raw, key, slots)
            if item is None or any(seen.slot == item.slot for seen in found):
                return Refused(key, f"manifest lists a slot it cannot have: {raw!r:.200}")
            status = _ours(self.directory / item.file)
            if status is None:
                return Refused(key, f"{item.file} is missing or not a file of ours")
            if status.st_size != item.bytes:
                return Refused(key, f"{item.file} has {status.st_size} bytes, not {item.bytes}")
            found.append(item)
        if not found:
            return Refused(key, "manifest lists no slot")
        role, model_id, when = data.get("role"), data.get("model_id"), data.get("saved_at")
        if not isinstance(role, str) or not isinstance(model_id, str):
            return Refused(key, "manifest names no role or model")
        saved_at = float(when) if isinstance(when, int | float) else 0.0
        return SavedSet(key, role, model_id, saved_at, tuple(found))

    def commit(self, key: str, role: str, model_id: str, slots: list[SavedSlot]) -> list[str]:
        """Keep ``slots`` (just written by the server) as ``key``'s set: private, its
        manifest written last; the role's other sets dropped; the budget kept. Returns
        the keys dropped."""
        for item in slots:
            os.chmod(self.directory / item.file, 0o600)
        manifest = {
            "format": FORMAT,
            "key": key,
            "role": role,
            "model_id": model_id,
            "saved_at": time.time(),
            "slots": [vars(item) for item in slots],
        }
        tmp = self.directory / f"{key}.json.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(manifest, handle)
        tmp.replace(self._manifest(key))
        dropped = [
            other
            for other, data in self._sets().items()
            if other != key and data.get("role") == role and data.get("model_id") == model_id
        ]
        for other in dropped:
            self.discard(other)
        return dropped + self.keep_budget()

    def _sets(self) -> dict[str, dict[str, Any]]:
        """Every manifest of ours, by key."""
        found: dict[str, dict[str, Any]] = {}
        try:
            names = os.listdir(self.directory)
        except OSError:
            return found
        for name in names:
            if name.endswith(".json") and _KEY.match(name[: -len(".json")]):
                key = name[: -len(".json")]
                data = self._read(key)
                if isinstance(data, dict):
                    found[key] = data
        return found

    def _size(self, key: str) -> int:
        total = 0
        for name in self._files(key):
            status = _ours(self.directory / name)
            total += status.st_size if status is not None else 0
        return total

    def _files(self, key: str) -> list[str]:
        try:
            names = os.listdir(self.directory)
        except OSError:
            return []
        return [n for n in names if (m := _OURS.match(n)) is not None and m.group(1) == key]

    def keep_budget(self) -> list[str]:
        """Drop the least recently used sets until the rest fit the budget (and files
        no manifest names); the keys dropped."""
        sets = self._sets()
        try:
            names = os.listdir(self.directory)
        except OSError:
            names = []
        for name in names:
            match = _OURS.match(name)
            if match is not None and match.group(1) not in sets:
                _remove(self.directory / name)  # a save cut short
        used = {key: self._manifest(key).stat().st_mtime for key in sets}
        sizes = {key: self._size(key) for key in sets}
        total = sum(sizes.values())
        dropped = []
        # A set larger than the whole budget can never fit: it goes first, alone.
        for key in sorted(used, key=lambda k: (sizes[k] <= self.budget_bytes, used[k])):
            if total <= self.budget_bytes:
                break
            self.discard(key)
            total -= sizes[key]
            dropped.append(key)
        return dropped

    def touch(self, key: str) -> None:
        """Mark ``key``'s set as just used (it is kept longest under the budget)."""
        with contextlib.suppress(OSError):
            os.utime(self._manifest(key))

    def discard(self, key: str) -> None:
        """Remove ``key``'s set, manifest first (so no half set is ever used)."""
        _remove(self._manifest(key))
        for name in self._files(key):
            _remove(self.directory / name)

    def clear(self) -> int:
        """Remove every file of ours; how many."""
        try:
            names = os.listdir(self.directory)
        except OSError:
            return 0
        removed = 0
        for name in sorted(names, key=lambda n: not n.endswith(".json")):
            if _OURS.match(name) and _remove(self.directory / name):
                removed += 1
        return removed


def _slot(raw: object, key: str, slots: int) -> SavedSlot | None:
    if not isinstance(raw, dict):
        return None
    slot, tokens, size, file = raw.get("slot"), raw.get("tokens"), raw.get("bytes"), raw.get("file")
    numbers = (slot, tokens, size)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in numbers):
        return None
    if not isinstance(slot, int) or not isinstance(tokens, int) or not isinstance(size, int):
        return None
    if slot >= slots or file != slot_file(key, slot):
        return None
    return SavedSlot(slot, file, tokens, size)


__all__ = ["FORMAT", "Refused", "SavedSet", "SavedSlot", "SlotStore", "slot_file"]
