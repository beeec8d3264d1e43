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

import asyncio
import contextlib
import json
import logging
import sys
import threading
import time
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any, Final, TextIO

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

    def line(
        self,
        created: float,
        levelname: str,
        _logger: str,
        message: str,
        request_id: str | None,
        _extra: Mapping[str, Any],
    ) -> str:
        """The line of a record made of these fields (no traceback)."""
        line = f"{self.stamp(created)} [{self.process}] {levelname} {message.rstrip()}"
        return line if request_id is None else f"{line} request_id={request_id}"

    def format(self, record: logging.LogRecord) -> str:
        request_id = getattr(record, "request_id", None)
        line = self.line(
            record.created, record.levelname, record.name, record.getMessage(), request_id, {}
        )
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

    def _entry(
        self,
        created: float,
        levelname: str,
        logger: str,
        message: str,
        request_id: str | None,
        extra: Mapping[str, Any],
    ) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "ts": self.stamp(created),
            "level": levelname,
            "logger": logger,
            "process": self.process,
            "message": message,
        }
        if request_id is not None:
            entry["request_id"] = request_id
        entry.update(extra)
        return entry

    def line(
        self,
        created: float,
        levelname: str,
        logger: str,
        message: str,
        request_id: str | None,
        extra: Mapping[str, Any],
    ) -> str:
        """The line of a record made of these fields (no traceback)."""
        entry = self._entry(created, levelname, logger, message, request_id, extra)
        return json.dumps(entry, default=str, ensure_ascii=False)

    def format(self, record: logging.LogRecord) -> str:
        extra = {
            key: value
            for key, value in vars(record).items()
            if key not in _STANDARD and not key.startswith("_")
        }
        request_id = getattr(record, "request_id", None)
        entry = self._entry(
            record.created, record.levelname, record.name, record.getMessage(), request_id, extra
        )
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


class LineHandler(logging.StreamHandler[TextIO]):
    """The one handler: a line per record on the stream. Bound to an event loop
    (:meth:`bind`), the INFO and DEBUG lines written from that loop's thread are
    flushed together within :data:`FLUSH_SECONDS` rather than one system call each;
    warnings and worse, and every line written from anywhere else, at once. A process
    killed with SIGKILL may lose the last ``FLUSH_SECONDS`` of such lines; an orderly
    exit flushes them (:func:`logging.shutdown`)."""

    def __init__(self, stream: TextIO, formatter: PlainFormatter | JsonFormatter) -> None:
        super().__init__(stream)
        self.setFormatter(formatter)
        self.lines = formatter
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = -1
        self._pending: asyncio.TimerHandle | None = None
        self._held: list[str] = []  # lines written on the loop, for the timer
        self._held_size = 0

    def bind(self, loop: asyncio.AbstractEventLoop | None) -> None:
        """Flush the lines ``loop``'s thread writes on a timer; None: each at once."""
        with self.lock or contextlib.nullcontext():
            if self._pending is not None:
                self._pending.cancel()
                self._pending = None
            self._loop = loop
            self._loop_thread = threading.get_ident() if loop is not None else -1
        self.flush()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
        except Exception:
            self.handleError(record)
            return
        self.write_line(text, record.levelno)

    def write_line(self, text: str, levelno: int) -> None:
        """Write one formatted line; flushed at once or soon, as the class says."""
        with self.lock or contextlib.nullcontext():
            line = text + self.terminator
            self._held.append(line)
            loop = self._loop
            if (
                levelno >= logging.WARNING
                or loop is None
                or threading.get_ident() != self._loop_thread
            ):
                self._write_held()
                return
            self._held_size += len(line)
            if self._held_size > HOLD_BYTES:
                self._write_held()
            elif self._pending is None:
                self._pending = loop.call_later(FLUSH_SECONDS, self._flush_due)

    def flush(self) -> None:
        """Write the lines held for the timer, and flush the stream."""
        with self.lock or contextlib.nullcontext():
            self._write_held()

    def _flush_due(self) -> None:
        with self.lock or contextlib.nullcontext():
            self._pending = None
            self._write_held()

    def _write_held(self) -> None:
        """The held lines in one write, then a flush (the caller holds the lock). The
        handler keeps them itself, so they go out together whatever the stream's own
        buffering (an unbuffered stdout, ``PYTHONUNBUFFERED``, included). When that
        write fails, each line is tried by itself, so only the lines the stream cannot
        take are lost; a full disk must not take requests down."""
        held, self._held = self._held, []
        self._held_size = 0
        if len(held) > 1:
            try:
                self.stream.write("".join(held))
                held = []
            except Exception:  # tried again line by line below
                pass
        for line in held:
            with contextlib.suppress(Exception):
                self.stream.write(line)
        with contextlib.suppress(Exception):
            self.stream.flush()


def direct_line_handler(logger: logging.Logger, levelno: int) -> LineHandler | None:
    """The :class:`LineHandler` a record of ``logger`` at ``levelno`` would reach and
    nothing else would see: then a caller may write its line straight through
    :meth:`LineHandler.write_line`, skipping the record (~10 µs a line). None when any
    other handler or filter is in the way (a test's capture, say), or the level is off."""
    root = logging.root
    if logger.filters or logger.disabled or not logger.isEnabledFor(levelno):
        return None
    node: logging.Logger | None = logger
    while node is not None and node is not root:  # loggers on the way pass it on untouched
        if node.handlers or not node.propagate:
            return None
        node = node.parent
    handlers = root.handlers
    if len(handlers) != 1 or root.filters:
        return None
    handler = handlers[0]
    if type(handler) is not LineHandler or levelno < handler.level or len(handler.filters) != 1:
        return None
    return handler if type(handler.filters[0]) is RequestIdFilter else None


def bind_to_loop(loop: asyncio.AbstractEventLoop | None) -> None:
    """:meth:`LineHandler.bind` for the handler :func:`configure` installed, if any."""
    for handler in logging.root.handlers:
        if isinstance(handler, LineHandler):
            handler.bind(loop)


# How soon an INFO line written on the event loop reaches the stream.
FLUSH_SECONDS: Final = 0.05
# Lines held for that timer past this many characters are written at once.
HOLD_BYTES: Final = 64 * 1024


def configure(process: str, json_lines: bool, stream: TextIO | None = None) -> LineHandler:
    """Send every log record to ``stream`` (stdout) as plain or JSON lines, tagged with
    ``process`` (``router``, ``backends``); returns the handler installed."""
    formatter = JsonFormatter(process) if json_lines else PlainFormatter(process)
    handler = LineHandler(stream or sys.stdout, formatter)
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
