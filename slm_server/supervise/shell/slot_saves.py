"""Saving a backend's slots on its way out and restoring them on its way in (the
shell's half of :mod:`slm_server.slotcache`).

Saved: when a ready backend is unloaded (idle TTL, eviction, the unload API), retired
by a reload once drained, or stopped at a graceful shutdown — never one the watchdog
stops (a wedged backend's state is not worth keeping, and asking it would only wait).
Restored: once a new process of the same launch answers ``/health``, before it is
published ready, so the first request already finds its prefix; after a crash too,
from the last set saved. Each slot is one ``POST /slots/{n}``, bounded by
``SLM_SLOT_CACHE_TIMEOUT_SECONDS``; a slot with nothing in it is not kept. A failure
of either is an event and nothing more: the unload, the load go on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from slm_server.contracts.events import EventSink
from slm_server.slotcache.store import Refused, SavedSet, SavedSlot, SlotStore, slot_file
from slm_server.supervise.shell.backend import Backend
from slm_server.supervise.shell.control import ProcessControl
from slm_server.supervise.shell.evidence import ProbeError

log = logging.getLogger("slm_server.supervisor")


@dataclass(frozen=True)
class _Answer:
    ok: bool
    data: dict[str, object]
    why: str


def _number(data: dict[str, object], name: str) -> int:
    value = data.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


class SlotSaves:
    """Save and restore through the backend's slot API, into ``store``."""

    def __init__(
        self, store: SlotStore, control: ProcessControl, events: EventSink, timeout: float
    ) -> None:
        self.store = store
        self.control = control
        self.events = events
        self.timeout = timeout
        # One save or restore at a time: a commit's budget check removes files no
        # manifest names yet, which another save in flight has just written, and may
        # drop a set another restore is reading.
        self._one_at_a_time: asyncio.Lock | None = None

    def _lock(self) -> asyncio.Lock:
        if self._one_at_a_time is None:
            self._one_at_a_time = asyncio.Lock()
        return self._one_at_a_time

    async def _action(
        self, backend: Backend, slot: int, action: str, name: str, deadline: float | None = None
    ) -> _Answer:
        plan = backend.plan
        assert plan is not None
        path = f"/slots/{slot}?action={action}"
        timeout = self.timeout
        if deadline is not None:
            timeout = min(timeout, deadline - time.monotonic())
            if timeout <= 0:
                return _Answer(False, {}, f"{path}: no time left (shutting down)")
        try:
            status, body = await self.control.post_json(
                plan.base_url, path, {"filename": name}, timeout
            )
        except ProbeError as exc:
            return _Answer(False, {}, str(exc))
        try:
            data = json.loads(body) if body else {}
        except ValueError:
            data = {}
        if not isinstance(data, dict):
            data = {}
        if status != 200:
            return _Answer(False, data, f"{path} answered {status}: {body[:200]!r}")
        return _Answer(True, data, "")

    def prepare_directory(self) -> Path | None:
        """The directory slots are saved in, made private; None (nothing kept) when it
        cannot be."""
        try:
            self.store.prepare()
        except OSError as exc:
            log.error(
                "prompt caches are not kept across unloads: %s: %s", self.store.directory, exc
            )
            return None
        return self.store.directory

    def slots(self, backend: Backend) -> int:
        return backend.spec.entry.max_concurrency

    def saved_tokens(self, key: str | None, slots: int) -> int | None:
        """Tokens of the set saved under ``key`` (None: not kept; 0: none usable)."""
        if key is None:
            return None
        found = self.store.saved(key, slots)
        return found.tokens if isinstance(found, SavedSet) else 0

    async def save(self, backend: Backend, deadline: float | None = None) -> None:
        """Save every slot of a ready backend that holds a prompt; the set replaces the
        model's earlier one. ``deadline`` (monotonic): give up then (a shutdown's)."""
        async with self._lock():
            await self._save(backend, deadline)

    async def restore(self, backend: Backend) -> None:
        """Restore the set saved for this launch, if there is one it may trust."""
        async with self._lock():
            await self._restore(backend)

    async def _save(self, backend: Backend, deadline: float | None) -> None:
        plan = backend.plan
        key = plan.slot_cache_key if plan is not None else None
        if key is None:
            return
        ids = backend.life.ids()
        began = time.monotonic()
        kept: list[SavedSlot] = []
        for slot in range(self.slots(backend)):
            name = slot_file(key, slot)
            answer = await self._action(backend, slot, "save", name, deadline)
            if not answer.ok:
                self.events.emit("cache_save_failed", **ids, slot=slot, reason=answer.why)
                self.store.discard(key)  # never half a set, nor an older one of this key
                backend.slot_tokens = 0
                return
            tokens, size = _number(answer.data, "n_saved"), _number(answer.data, "n_written")
            if tokens == 0:
                (self.store.directory / name).unlink(missing_ok=True)
                continue
            kept.append(SavedSlot(slot, name, tokens, size))
        if not kept:
            return
        try:
            dropped = self.store.commit(key, backend.role, backend.spec.entry.id, kept)
        except OSError as exc:
            self.events.emit("cache_save_failed", **ids, reason=f"cannot keep it: {exc}")
            self.store.discard(key)
            backend.slot_tokens = 0
            return
        size = sum(s.bytes for s in kept)
        if key in dropped:  # larger than the whole disk budget
            budget = self.store.budget_bytes // (1 << 20)
            why = f"{size} bytes do not fit SLM_SLOT_CACHE_MB={budget}"
            self.events.emit("cache_save_failed", **ids, reason=why)
            backend.slot_tokens = 0
            return
        backend.slot_tokens = sum(s.tokens for s in kept)
        self.events.emit(
            "cache_saved",
            **ids,
            slots=len(kept),
            tokens=sum(s.tokens for s in kept),
            bytes=size,
            ms=round((time.monotonic() - began) * 1000, 1),
            dropped=dropped or None,
        )

    async def _restore(self, backend: Backend) -> None:
        plan = backend.plan
        key = plan.slot_cache_key if plan is not None else None
        if key is None:
            return
        ids = backend.life.ids()
        found = self.store.saved(key, self.slots(backend))
        if found is None:
            return
        if isinstance(found, Refused):
            self.events.emit("cache_rejected", **ids, reason=found.reason)
            self.store.discard(key)
            backend.slot_tokens = 0
            return
        began = time.monotonic()
        tokens = size = 0
        for item in found.slots:
            answer = await self._action(backend, item.slot, "restore", item.file)
            if not answer.ok:
                self.events.emit("cache_rejected", **ids, slot=item.slot, reason=answer.why)
                self.store.discard(key)
                backend.slot_tokens = 0
                return
            tokens += _number(answer.data, "n_restored")
            size += _number(answer.data, "n_read")
        self.store.touch(key)
        backend.slot_tokens = found.tokens
        self.events.emit(
            "cache_restored",
            **ids,
            slots=len(found.slots),
            tokens=tokens,
            bytes=size,
            ms=round((time.monotonic() - began) * 1000, 1),
        )


__all__ = ["SlotSaves"]
