"""Measured footprints remembered across runs, so later admissions need no estimate.

One small JSON file, written by one process (the launcher) and replaced atomically
(``records.write_json_atomic``)::

    {"version": 1, "entries": [{"key": "...", "mb": 215, "measured_at": 1700000000.0}]}

Entries are kept oldest first and at most ``max_entries`` of them: storing a key again
moves it to the end, and the oldest fall off. A key (:class:`FootprintKey`) names
everything that decides a footprint, the model file's size and mtime included, so a
replaced model or a changed context is measured afresh instead of trusting a stale
value. A missing, corrupt or oversized file reads as empty; a failed write (full disk,
read-only directory) is reported by ``put`` returning ``False`` with the reason in
``last_error``, and the value is still remembered for this run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

from slm_server.contracts.records import read_json, write_json_atomic

FORMAT_VERSION: Final = 1
DEFAULT_MAX_ENTRIES: Final = 256
MAX_FILE_BYTES: Final = 1 << 20


@dataclass(frozen=True)
class FootprintKey:
    """What decides a backend's footprint. ``extra`` carries any other flag the caller
    knows to matter (``"kv_unified"``, a draft model's path...), in a stable spelling:
    ``FootprintKey.of("llamacpp", path, context_length=4096, parallel=2)``.
    """

    backend: str
    model: str
    size: int
    mtime_ns: int
    context_length: int | None
    parallel: int
    cache_type_k: str | None = None
    cache_type_v: str | None = None
    extra: str = ""

    @classmethod
    def of(
        cls,
        backend: str,
        model: Path,
        *,
        context_length: int | None,
        parallel: int,
        cache_type_k: str | None = None,
        cache_type_v: str | None = None,
        extra: str = "",
    ) -> FootprintKey:
        """The key for ``model`` (a file, or an MLX directory: the files directly in it)
        as it is on disk now; raises ``OSError`` when it cannot be read."""
        resolved = model.resolve()
        if resolved.is_dir():
            stats = [p.stat() for p in sorted(resolved.iterdir()) if p.is_file()]
            size = sum(s.st_size for s in stats)
            mtime_ns = max((s.st_mtime_ns for s in stats), default=0)
        else:
            stat = resolved.stat()
            size, mtime_ns = stat.st_size, stat.st_mtime_ns
        return cls(
            backend=backend,
            model=str(resolved),
            size=size,
            mtime_ns=mtime_ns,
            context_length=context_length,
            parallel=parallel,
            cache_type_k=cache_type_k,
            cache_type_v=cache_type_v,
            extra=extra,
        )

    def text(self) -> str:
        """The key as stored: canonical JSON of its fields."""
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))


def _key_text(key: FootprintKey | str) -> str:
    return key.text() if isinstance(key, FootprintKey) else key


@dataclass(frozen=True)
class _Entry:
    mb: int
    measured_at: float


class FootprintStore:
    """The footprints measured so far, read from ``path`` once and saved on each put."""

    def __init__(
        self,
        path: Path,
        *,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, not {max_entries}")
        self.path = path
        self.max_entries = max_entries
        self.last_error: str | None = None
        self._clock = clock
        self._entries: dict[str, _Entry] = self._load()

    def _load(self) -> dict[str, _Entry]:
        try:
            if self.path.stat().st_size > MAX_FILE_BYTES:
                return {}
        except OSError:
            return {}
        data = read_json(self.path)
        raw = data.get("entries") if isinstance(data, dict) else None
        if data is None or not isinstance(raw, list) or data.get("version") != FORMAT_VERSION:
            return {}
        entries: dict[str, _Entry] = {}
        for item in raw:
            if not isinstance(item, dict):
                continue
            key, mb, at = item.get("key"), item.get("mb"), item.get("measured_at", 0.0)
            if (
                isinstance(key, str)
                and isinstance(mb, int)
                and not isinstance(mb, bool)
                and mb > 0
                and isinstance(at, int | float)
            ):
                entries.pop(key, None)
                entries[key] = _Entry(mb, float(at))
        return dict(list(entries.items())[-self.max_entries :])

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: FootprintKey | str) -> int | None:
        """The footprint measured for ``key`` in MiB, ``None`` when never measured."""
        entry = self._entries.get(_key_text(key))
        return None if entry is None else entry.mb

    def put(self, key: FootprintKey | str, mb: int) -> bool:
        """Remember ``mb`` for ``key`` and save the file. ``False`` when the file could
        not be written (``last_error`` says why); the value is kept for this run."""
        if isinstance(mb, bool) or not isinstance(mb, int) or mb <= 0:
            raise ValueError(f"a footprint is a positive number of MiB, not {mb!r}")
        text = _key_text(key)
        self._entries.pop(text, None)
        self._entries[text] = _Entry(mb, self._clock())
        while len(self._entries) > self.max_entries:
            del self._entries[next(iter(self._entries))]
        data = {
            "version": FORMAT_VERSION,
            "entries": [
                {"key": k, "mb": e.mb, "measured_at": e.measured_at}
                for k, e in self._entries.items()
            ],
        }
        try:
            write_json_atomic(self.path, data)
        except OSError as exc:
            self.last_error = f"cannot write {self.path}: {exc.strerror or exc}"
            return False
        self.last_error = None
        return True
