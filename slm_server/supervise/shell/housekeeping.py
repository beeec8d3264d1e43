"""The supervisor's file chores: backends an earlier launcher left (by its pidfile),
the router's restart request files, oversized logs. A failed chore becomes an event,
once per distinct error (a full disk would otherwise repeat it every sweep), and
supervision goes on."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from slm_server.contracts.events import EventLog
from slm_server.contracts.records import PidRecord, read_pidfile
from slm_server.contracts.restart_requests import RestartRequest, take_requests
from slm_server.settings import Settings
from slm_server.supervise.shell.backend import Backend
from slm_server.supervise.shell.control import ProcessControl

log = logging.getLogger("slm_server.supervisor")


class ChoreErrors:
    """The last error reported for each chore (by path): reported again only when it
    changes, or after the chore succeeded in between."""

    def __init__(self, events: EventLog) -> None:
        self.events = events
        self.last: dict[str, str] = {}  # path -> the last error reported for it

    def failed(self, event: str, key: str, error: OSError, **fields: Any) -> None:
        message = f"{type(error).__name__}: {error}"
        if self.last.get(key) == message:
            return
        self.last[key] = message
        self.events.emit(event, **fields, path=key, error=message)

    def done(self, key: str) -> None:
        self.last.pop(key, None)


class Housekeeping:
    """Leftovers, restart requests and log trimming, through the process control."""

    def __init__(
        self, settings: Settings, control: ProcessControl, events: EventLog, chores: ChoreErrors
    ) -> None:
        self.settings = settings
        self.watchdog = settings.watchdog
        self.control = control
        self.events = events
        self.chores = chores

    def sweep_leftovers(self) -> list[PidRecord]:
        """Stop processes an earlier launcher started and could not stop (it was
        SIGKILLed where there is no parent-death signal): only those whose pid *and*
        create time still match the pidfile. Its records, for telling our own port
        squatters from others'."""
        records = read_pidfile(self.settings.pidfile_path)
        for record in records:
            timeout = self.settings.stop_timeout_seconds
            if self.control.stop_leftover(record.pid, record.create_time, timeout):
                log.warning(
                    "stopped leftover backend %s (pid %d, port %d) from a previous run",
                    record.model_id,
                    record.pid,
                    record.port,
                )
        return records

    def take_requests(self) -> list[RestartRequest | str]:
        """The router's restart requests (each file deleted as it is read); none when
        the directory cannot be read (``request_sweep_failed``)."""
        directory = self.watchdog.request_dir
        try:
            requests = take_requests(directory)
        except OSError as exc:
            self.chores.failed("request_sweep_failed", str(directory), exc)
            return []
        self.chores.done(str(directory))
        return requests

    def trim_logs(self, backends: Iterable[Backend]) -> None:
        """Trim the watchdog log and each backend's log past ``backend_log_max_mb``
        (``backend_log_trimmed``, or ``backend_log_trim_failed``)."""
        max_bytes = int(self.watchdog.backend_log_max_mb * 1024 * 1024)
        if max_bytes <= 0:
            return
        self.trim(self.watchdog.log_path, max_bytes, {})
        for backend in backends:
            if backend.plan is not None:
                self.trim(backend.plan.log_path, max_bytes, backend.life.ids())

    def trim(self, path: Path, max_bytes: int, ids: Mapping[str, object]) -> None:
        try:
            size = self.control.trim_log(path, max_bytes)
        except OSError as exc:
            self.chores.failed("backend_log_trim_failed", str(path), exc, **ids)
            return
        self.chores.done(str(path))
        if size is not None:
            self.events.emit("backend_log_trimmed", **ids, path=str(path), bytes=size)
