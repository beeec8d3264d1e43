"""``python -m slm_server logs`` / ``scripts/slm-logs.sh``: ``start.out`` (what start.sh
printed; lines stamped ``2026-11-30T09:14:02.117Z [router] INFO ...`` or unstamped) and
``watchdog.jsonl`` (one JSON event per line), shown as ``server``, ``watchdog`` (a
timeline), ``all`` (both merged by time) or ``raw``; ``follow`` tails them like ``tail -F``.
"""

from __future__ import annotations

import contextlib
import datetime
import heapq
import json
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple, TextIO

from slm_server.contracts.events import EVENTS

MODES = ("server", "watchdog", "all", "raw")  # ``server`` is the default
POLL_SECONDS = 0.25
WATCHDOG_MARK = "[watchdog] "

RESET, BOLD, DIM = "\033[0m", "\033[1m", "\033[2m"
RED, GREEN, YELLOW, CYAN = "\033[31m", "\033[32m", "\033[33m", "\033[36m"

_EVENT_WIDTH = max(len(name) for name in EVENTS)
# Failures red, recoveries green, housekeeping dim, every other known event yellow.
_FAILURES = "backend_failure backend_exited restart_failed backend_abandoned model_path_missing"
_EVENT_COLOURS = {
    **dict.fromkeys(EVENTS, YELLOW),
    **dict.fromkeys(
        (*_FAILURES.split(), "stray_kill_refused", "remote_ejected", "supervisor_refused"), RED
    ),
    **dict.fromkeys(
        ("restart_succeeded", "supervisor_started", "remote_readmitted", "request_retried"),
        GREEN,
    ),
    **dict.fromkeys(("supervisor_stopped", "backend_log_trimmed"), DIM),
}
# How the backend an event concerns is named: ``reasoning (unsloth/qwen3) :8502``.
_SUBJECT = (("role", "{}"), ("model_id", "({})"), ("port", ":{}"))
_ISO_PREFIX = re.compile(
    r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?(?=\s|$)"
)
_ERROR = re.compile(r"\b(?:ERROR|CRITICAL)\b|^Traceback \(most recent call last\)")
_WARNING = re.compile(r"\bWARNING\b")


def use_colour(stream: TextIO, environ: Mapping[str, str] | None = None) -> bool:
    """Colour only on a terminal, and never when ``NO_COLOR`` is set (no-color.org)."""
    env = os.environ if environ is None else environ
    return stream.isatty() and not env.get("NO_COLOR")


def _paint(text: str, code: str, colour: bool) -> str:
    return f"{code}{text}{RESET}" if colour and code else text


def parse_time(
    item: Mapping[str, Any] | str, previous: datetime.datetime | None = None
) -> datetime.datetime | None:
    """The UTC time of a watchdog record (its ``ts``) or of a log line that starts with
    an ISO timestamp; anything without one inherits ``previous``."""
    if isinstance(item, str):
        match = _ISO_PREFIX.match(item)
        text = match.group(0) if match else None
    else:
        raw = item.get("ts")
        text = raw if isinstance(raw, str) else None
    if text is None:
        return previous
    try:
        moment = datetime.datetime.fromisoformat(text.replace(",", "."))
    except ValueError:
        return previous
    if moment.tzinfo is None:
        return moment.replace(tzinfo=datetime.UTC)
    return moment.astimezone(datetime.UTC)


def _clock(moment: datetime.datetime, date: bool = True) -> str:
    shown = moment.strftime("%Y-%m-%d %H:%M:%S" if date else "%H:%M:%S")
    return f"{shown}.{moment.microsecond // 1000:03d}"


def _field(key: str, value: Any) -> str:
    """``key=value``: numbers plain (``stall_seconds=300.0`` as ``stall=300s``, ``*_mb``
    likewise), wall-clock ``*_at`` as a UTC time, strings quoted when they hold spaces
    or quotes, lists and dicts as compact JSON."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        shown = json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)
    elif isinstance(value, str):
        plain = value and not any(c.isspace() or c in "\"'" for c in value)
        shown = value if plain else json.dumps(value, ensure_ascii=False)
    elif key.endswith("_at") and value > 1e9:
        shown = _clock(datetime.datetime.fromtimestamp(value, tz=datetime.UTC), date=False)
    else:
        shown = str(int(value)) if float(value).is_integer() else repr(value)
        for suffix, unit in (("_seconds", "s"), ("_mb", "MB")):
            if key.endswith(suffix):
                key, shown = key.removesuffix(suffix), shown + unit
    return f"{key}={shown}"


def format_event(record: Mapping[str, Any], colour: bool = False) -> str:
    """One timeline line: UTC time, event name, the backend it concerns (role, model id,
    port) or ``supervisor``, then every other field as ``key=value``."""
    event = str(record.get("event", "?"))
    moment = parse_time(record)
    stamp = _clock(moment) if moment else str(record.get("ts", "-")).ljust(23)
    code = _EVENT_COLOURS.get(event, "")
    parts = [_paint(stamp, DIM, colour), _paint(event.ljust(_EVENT_WIDTH), code, colour)]
    subject = " ".join(shape.format(record[key]) for key, shape in _SUBJECT if key in record)
    if not subject and event.startswith(("supervisor_", "config_")):
        subject = "supervisor"
    if subject:
        parts.append(_paint(subject, BOLD, colour))
    skip = {"ts", "event", *(key for key, _shape in _SUBJECT)}
    fields = [_field(key, value) for key, value in record.items() if key not in skip]
    if fields:
        parts.append(" ".join(fields))
    return "  ".join(parts)


def format_watchdog_line(line: str, colour: bool = False) -> str | None:
    """A raw ``watchdog.jsonl`` line as a timeline line; ``? <line>`` when it is not a
    JSON event; ``None`` for a blank line."""
    text = line.rstrip()
    if not text:
        return None
    record = parse_record(text)
    if record is None:
        return _paint(f"? {text}", RED, colour)
    return format_event(record, colour)


def parse_record(line: str) -> dict[str, Any] | None:
    """A watchdog line's JSON object, or ``None`` when it is not an event."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("event"), str):
        return None
    return record


def format_server_line(line: str, colour: bool = False) -> str:
    """A ``start.out`` line as it is, trailing whitespace stripped; with colour, errors
    red, warnings yellow, watchdog lines cyan and ``[start]`` lines bold."""
    text = line.rstrip()
    if not colour:
        return text
    if _ERROR.search(text):
        return _paint(text, RED, colour)
    if _WARNING.search(text):
        return _paint(text, YELLOW, colour)
    if "watchdog:" in text:
        return _paint(text, CYAN, colour)
    if text.startswith("[start]"):
        return _paint(text, BOLD, colour)
    return text


class LogFile:
    """A file read incrementally: each ``read_lines()`` returns the complete lines
    appended since the last call (the whole file the first time). A file that shrinks
    (truncated) is read again from its start; one replaced or removed (rotated) is
    drained, then its successor is read from the start once it appears."""

    def __init__(self, path: Path, kind: str = "server") -> None:
        self.path = path
        self.kind = kind
        self.last_time: datetime.datetime | None = None
        self._handle: BinaryIO | None = None
        self._pending = b""

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def read_lines(self, final: bool = False) -> list[str]:
        """New complete lines; with ``final``, also a last line lacking its newline."""
        lines: list[str] = []
        try:
            current: os.stat_result | None = os.stat(self.path)
        except OSError:
            current = None
        if self._handle is not None:
            opened = os.fstat(self._handle.fileno())
            if current is None or not os.path.samestat(current, opened):
                lines = self._split(self._handle.read(), final=True)
                self.close()
            elif current.st_size < self._handle.tell():
                self._handle.seek(0)
                self._pending = b""
        if self._handle is None and current is not None:
            with contextlib.suppress(OSError):
                self._handle = self.path.open("rb")
        if self._handle is not None:
            lines += self._split(self._handle.read(), final)
        return lines

    def _split(self, data: bytes, final: bool) -> list[str]:
        chunks = (self._pending + data).split(b"\n")
        self._pending = chunks.pop()
        if final and self._pending:
            chunks.append(self._pending)
            self._pending = b""
        return [chunk.decode("utf-8", errors="replace").rstrip("\r") for chunk in chunks]


class _Item(NamedTuple):
    time: datetime.datetime | None
    text: str


def _items(mode: str, source: LogFile, lines: Iterable[str], colour: bool) -> list[_Item]:
    """Rendered lines of one file, each with its (possibly inherited) time."""
    items = []
    for line in lines:
        if mode == "raw":
            items.append(_Item(None, line))
            continue
        if source.kind == "watchdog":
            source.last_time = parse_time(parse_record(line) or {}, source.last_time)
            text = format_watchdog_line(line, colour)
            if text is not None and mode == "all":
                text = _paint(WATCHDOG_MARK, CYAN, colour) + text
        else:
            source.last_time = parse_time(line, source.last_time)
            text = format_server_line(line, colour)
        if text is not None:
            items.append(_Item(source.last_time, text))
    return items


def _merge(batches: list[list[_Item]]) -> Iterable[_Item]:
    """Each file's lines in their own order, interleaved by time; earlier batches win
    ties. Lines before any timestamp come first."""
    earliest = datetime.datetime.min.replace(tzinfo=datetime.UTC)
    return heapq.merge(*batches, key=lambda item: item.time or earliest)


def render(
    mode: str, log_dir: Path, watchdog_path: Path, follow: bool, colour: bool, out: TextIO
) -> int:
    """Print the logs in ``mode``; with ``follow``, keep printing what is appended
    (polling every 0.25 s) until Ctrl-C or SIGTERM. Returns the exit status: 1 when
    there is nothing to show (for ``all`` and ``raw``: neither file exists)."""
    server, watchdog = LogFile(log_dir / "start.out", "server"), LogFile(watchdog_path, "watchdog")
    # In ``all`` the watchdog comes first: at equal times an event precedes its log line.
    orders = {"server": [server], "watchdog": [watchdog], "all": [watchdog, server]}
    sources = orders.get(mode, [server, watchdog])
    absent = [source for source in sources if not source.path.is_file()]
    for source in absent:
        why = "no server output yet" if source.kind == "server" else "no watchdog event yet"
        print(f"logs: {source.path} does not exist ({why})", file=sys.stderr)
    if len(absent) == len(sources):
        return 1
    handle_term = follow and threading.current_thread() is threading.main_thread()
    # SIGTERM raises KeyboardInterrupt, so both end the loop the same clean way.
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler) if handle_term else None
    try:
        _emit(mode, sources, colour, out, final=not follow)
        while follow:
            time.sleep(POLL_SECONDS)
            _emit(mode, sources, colour, out, final=False)
    except KeyboardInterrupt:
        return 0
    finally:
        if handle_term:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
        for source in sources:
            source.close()
    return 0


def _emit(mode: str, sources: list[LogFile], colour: bool, out: TextIO, final: bool) -> None:
    batches = [_items(mode, s, s.read_lines(final), colour) for s in sources]
    items = (i for b in batches for i in b) if mode == "raw" else _merge(batches)
    text = "".join(item.text + "\n" for item in items)
    if text:
        out.write(text)
        out.flush()


def main(mode: str, log_dir: Path, watchdog_path: Path, follow: bool) -> int:
    """``python -m slm_server logs``: render to stdout, coloured on a terminal."""
    try:
        return render(mode, log_dir, watchdog_path, follow, use_colour(sys.stdout), sys.stdout)
    except BrokenPipeError:
        # The reader (``| head``) left: stop quietly, and keep Python's exit flush quiet.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 0
