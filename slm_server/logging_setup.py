"""How the router and the launcher write their logs: one line per record, on stdout.

Plain lines keep the UTC stamp the watchdog log uses, so ``slm-logs.sh all`` can
interleave them; a record made while serving a request ends with its id::

    2026-11-30T09:14:02.117Z [router] INFO POST /v1/embeddings 200 4.7ms model=m request_id=5f0c

With ``SLM_LOG_JSON=true`` each record is one JSON object instead::

    {"ts": "2026-11-30T09:14:02.117Z", "level": "INFO", "logger": "slm_server.access",
     "process": "router", "message": "...", "request_id": "5f0c…", "status": 200, ...}

The request id travels in a context variable (``REQUEST_ID``) that the router's
middleware sets for the duration of a request; :class:`RequestIdFilter` copies it onto
every record, including those of libraries logging on the request's behalf.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from contextvars import ContextVar
from typing import Any, TextIO

REQUEST_ID: ContextVar[str | None] = ContextVar("slm_request_id", default=None)

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = frozenset(
    {
        *vars(logging.LogRecord("", 0, "", 0, "", None, None)),
        "message",
        "asctime",
        "request_id",
        "taskName",
    }
)


def utc_stamp(created: float) -> str:
    """``2026-11-30T09:14:02.117Z`` for a record's ``created`` time."""
    seconds = int(created)
    millis = int((created - seconds) * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


class Stamps:
    """:func:`utc_stamp`, with the part up to the seconds worked out once a second."""

    __slots__ = ("_prefix", "_second")

    def __init__(self) -> None:
        self._second = -1
        self._prefix = ""

    def __call__(self, created: float) -> str:
        seconds = int(created)
        if seconds != self._second:
            self._prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
            self._second = seconds
        return f"{self._prefix}.{int((created - seconds) * 1000):03d}Z"


class RequestIdFilter(logging.Filter):
    """Stamps each record with the id of the request being served, if any."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None:
            record.request_id = REQUEST_ID.get()
        return True


class PlainFormatter(logging.Formatter):
    """``<UTC stamp> [<process>] <LEVEL> <message>`` plus `` request_id=<id>`` when known."""

    def __init__(self, process: str) -> None:
        super().__init__()
        self.process = process
        self.stamp = Stamps()

    def format(self, record: logging.LogRecord) -> str:
        line = f"{self.stamp(record.created)} [{self.process}] {record.levelname} "
        line += record.getMessage().rstrip()
        request_id = getattr(record, "request_id", None)
        if request_id is not None:
            line += f" request_id={request_id}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``ts``, ``level``, ``logger``, ``process``,
    ``message``, ``request_id`` when known, every ``extra=`` field, and ``exception``
    (the formatted traceback) when there is one."""

    def __init__(self, process: str) -> None:
        super().__init__()
        self.process = process
        self.stamp = Stamps()

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": self.stamp(record.created),
            "level": record.levelname,
            "logger": record.name,
            "process": self.process,
            "message": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None)
        if request_id is not None:
            entry["request_id"] = request_id
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


def configure(process: str, json_lines: bool, stream: TextIO | None = None) -> logging.Handler:
    """Send every log record to ``stream`` (stdout) as plain or JSON lines, tagged with
    ``process`` (``router``, ``backends``); returns the handler installed."""
    handler = logging.StreamHandler(stream or sys.stdout)
    handler.setFormatter(JsonFormatter(process) if json_lines else PlainFormatter(process))
    handler.addFilter(RequestIdFilter())
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)
    # No line shows a record's thread or process (the JSON lines leave out every
    # standard attribute), so records need not look them up: a getpid() system call
    # and two lookups fewer per access line.
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    # One line per health probe would drown the launcher's own messages.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    # python-multipart warns about every malformed form a client sends; that client
    # gets a 400 saying why, and the access log has the request.
    logging.getLogger("python_multipart").setLevel(logging.ERROR)
    return handler
