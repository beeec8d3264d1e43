"""The watchdog's audit log: ``logs/watchdog.jsonl``, one JSON object per line,
appended by both the router and the supervisor.

Every line has ``ts`` (UTC, ISO-8601 with milliseconds) and ``event``; the rest depends
on the event (``port``, ``role``, ``model_id``, ``reason``, pids, ``attempt`` ...).
Each line is written with a single ``write`` on an ``O_APPEND`` descriptor, so lines
from the two processes never interleave.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger("slm_server.watchdog")

EVENTS = frozenset(
    {
        "backend_failure",
        "unclassified_status",
        "deadline_not_counted",
        "restart_requested",
        "request_retried",
        "stale_request_discarded",
        "backend_exited",
        "backend_not_running",
        "restart_started",
        "restart_succeeded",
        "restart_failed",
        "port_stray_killed",
        "stray_kill_refused",
        "model_path_missing",
        "backend_abandoned",
        "backend_log_trimmed",
        "process_unkillable",
        "backend_log_trim_failed",
        "state_write_failed",
        "request_sweep_failed",
        "restart_confirmed",
        "restart_not_confirmed",
        "supervisor_started",
        "supervisor_stopped",
        "supervisor_refused",
        "backend_loading",
        "backend_loaded",
        "backend_unloaded",
        "load_failed",
        "memory_grew",
        "memory_pressure",
        "evicted_for_pressure",
        "cache_saved",
        "cache_save_failed",
        "cache_restored",
        "cache_rejected",
        "remote_ejected",
        "remote_readmitted",
        "config_reload_requested",
        "config_reloaded",
        "config_reload_refused",
        "backend_retiring",
        "backend_retired",
    }
)


def utc_timestamp(wall: float) -> str:
    moment = datetime.datetime.fromtimestamp(wall, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


class EventSink(Protocol):
    """Where watchdog events go: :class:`EventLog` in production."""

    def emit(self, event: str, **fields: Any) -> dict[str, Any]:
        """Record one event (``None`` fields left out) and return it as recorded."""
        ...


class EventLog:
    """Appends watchdog events to a JSONL file (and mirrors them to the logger)."""

    def __init__(self, path: Path, wall: Callable[[], float] = time.time) -> None:
        self.path = path
        self.wall = wall
        self._lock = threading.Lock()

    def emit(self, event: str, **fields: Any) -> dict[str, Any]:
        """Append one event; ``None`` fields are left out."""
        if event not in EVENTS:
            raise ValueError(f"unknown watchdog event {event!r}")
        record: dict[str, Any] = {"ts": utc_timestamp(self.wall())}
        record["event"] = event
        record.update({k: v for k, v in fields.items() if v is not None})
        line = (json.dumps(record, separators=(",", ":"), default=str) + "\n").encode()
        with self._lock:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    os.write(fd, line)
                finally:
                    os.close(fd)
            except OSError as exc:
                log.error("cannot append to %s: %s", self.path, exc)
        details = " ".join(f"{k}={v}" for k, v in record.items() if k not in ("ts", "event"))
        log.info("watchdog: %s %s", event, details)
        return record
