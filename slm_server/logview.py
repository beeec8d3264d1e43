"""Reading the gateway's logs: ``python -m slm_server logs`` and ``scripts/slm-logs.sh``.

Two files: ``start.out`` (everything ``start.sh`` printed: launcher, router and uvicorn
lines stamped ``2026-11-30T09:14:02.117Z [router] INFO ...``, plus unstamped ``[start]``
and ``[setup]`` lines) and the watchdog's ``watchdog.jsonl`` (one JSON event per line).
Modes: ``server`` (start.out), ``watchdog`` (a readable timeline of the events), ``all``
(both, merged in time order) and ``raw`` (both files as they are). ``follow`` keeps
printing what is appended, across truncation and rotation, until Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import datetime
import heapq
import json
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, BinaryIO, TextIO

from slm_server.supervise.events import EVENTS

MODES = ("server", "watchdog", "all", "raw")
POLL_SECONDS = 0.25
WATCHDOG_MARK = "[watchdog] "

RESET, BOLD, DIM = "\033[0m", "\033[1m", "\033[2m"
RED, GREEN, YELLOW, CYAN = "\033[31m", "\033[32m", "\033[33m", "\033[36m"

_EVENT_WIDTH = max(len(name) for name in EVENTS)
_EVENT_COLOURS = {
    **dict.fromkeys(
        ("backend_failure", "backend_exited", "restart_failed", "backend_abandoned"), RED
    ),
    **dict.fromkeys(("model_path_missing", "stray_kill_refused"), RED),
    **dict.fromkeys(("restart_succeeded", "supervisor_started"), GREEN),
    **dict.fromkeys(("supervisor_stopped", "backend_log_trimmed"), DIM),
}
_SUBJECT_KEYS = ("role", "model_id", "port")
_ISO_PREFIX = re.compile(
    r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?(?=\s|$)"
)
_ERROR = re.compile(r"\b(?:ERROR|CRITICAL)\b|^Traceback \(most recent call last\)")
_WARNING = re.compile(r"\bWARNING\b")


def use_colour(stream: TextIO, environ: Mapping[str, str] | None = None) -> bool:
    """Colour only on a terminal, and never when ``NO_COLOR`` is set (no-color.org)."""
    env = os.environ if environ is None else environ
    isatty = getattr(stream, "isatty", None)
    return bool(isatty is not None and isatty()) and not env.get("NO_COLOR")


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


def _value(key: str, value: Any) -> str:
    """One field's value: numbers plain, ``*_seconds`` with a unit, wall-clock ``*_at``
    as a UTC time, strings quoted when they hold spaces, containers as compact JSON."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int | float):
        if key.endswith("_at") and value > 1e9:
            stamp = datetime.datetime.fromtimestamp(value, tz=datetime.UTC)
            return _clock(stamp, date=False)
        number = str(int(value)) if float(value).is_integer() else repr(value)
        return number + "s" if key.endswith("_seconds") else number
    if isinstance(value, str):
        plain = value and not any(c.isspace() or c in "\"'" for c in value)
        return value if plain else json.dumps(value, ensure_ascii=False)
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)


def format_event(record: Mapping[str, Any], colour: bool = False) -> str:
    """One timeline line: UTC time, event name, the backend it concerns (role, model id,
    port) or ``supervisor``, then every other field as ``key=value``."""
    event = str(record.get("event", "?"))
    moment = parse_time(record)
    stamp = _clock(moment) if moment else str(record.get("ts", "-")).ljust(23)
    parts = [_paint(stamp, DIM, colour), _paint(event.ljust(_EVENT_WIDTH), _event_code(event), colour)]
    subject = []
    if "role" in record:
        subject.append(str(record["role"]))
    if "model_id" in record:
        subject.append(f"({record['model_id']})")
    if "port" in record:
        subject.append(f":{record['port']}")
    if not subject and event.startswith("supervisor_"):
        subject.append("supervisor")
    if subject:
        parts.append(_paint(" ".join(subject), BOLD, colour))
    fields = [
        f"{key}={_value(key, value)}"
        for key, value in record.items()
        if key not in ("ts", "event", *_SUBJECT_KEYS)
    ]
    if fields:
        parts.append(" ".join(fields))
    return "  ".join(parts)


def _event_code(event: str) -> str:
    return _EVENT_COLOURS.get(event, YELLOW if event in EVENTS else RED)


def format_watchdog_line(line: str, colour: bool = False) -> str | None:
    """A raw ``watchdog.jsonl`` line as a timeline line; ``? <line>`` when it is not a
    JSON event; ``None`` for a blank line."""
    text = line.rstrip()
    if not text:
        return None
    try:
        record = json.loads(text)
    except ValueError:
        record = None
    if not isinstance(record, dict) or not isinstance(record.get("event"), str):
        return _paint(f"? {text}", RED, colour)
    return format_event(record, colour)


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
    (truncated) is read again from the start; one replaced by another (rotated) is
    drained, then the new one is read from its start."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.last_time: datetime.datetime | None = None
        self._handle: BinaryIO | None = None
        self._pending = b""

    def exists(self) -> bool:
        return self.path.is_file()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def read_lines(self, final: bool = False) -> list[str]:
        """New complete lines; with ``final``, also a last line lacking its newline."""
        data = b""
        try:
            current = os.stat(self.path)
        except OSError:
            current = None
        if self._handle is not None:
            opened = os.fstat(self._handle.fileno())
            if current is None or (current.st_dev, current.st_ino) != (
                opened.st_dev,
                opened.st_ino,
            ):
                data = self._handle.read()
                self.close()
            elif current.st_size < self._handle.tell():
                self._handle.seek(0)
                self._pending = b""
        if self._handle is None and current is not None:
            try:
                self._handle = self.path.open("rb")
            except OSError:
                return self._split(data, final)
        if self._handle is not None:
            data += self._handle.read()
        return self._split(data, final)

    def _split(self, data: bytes, final: bool) -> list[str]:
        chunks = (self._pending + data).split(b"\n")
        self._pending = chunks.pop()
        if final and self._pending:
            chunks.append(self._pending)
            self._pending = b""
        return [chunk.decode("utf-8", errors="replace").rstrip("\r") for chunk in chunks]


@dataclass(frozen=True)
class _Item:
    time: datetime.datetime | None
    text: str


_EARLIEST = datetime.datetime.min.replace(tzinfo=datetime.UTC)


def _items(mode: str, source: LogFile, lines: Iterable[str], colour: bool) -> list[_Item]:
    """Rendered lines of one file, each with its (possibly inherited) time."""
    is_watchdog = source.path.suffix == ".jsonl"
    items = []
    for line in lines:
        if mode == "raw":
            items.append(_Item(None, line))
            continue
        if is_watchdog:
            try:
                record = json.loads(line)
            except ValueError:
                record = None
            if isinstance(record, dict):
                source.last_time = parse_time(record, source.last_time)
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
    return heapq.merge(*batches, key=lambda item: item.time or _EARLIEST)


class _Stopped(Exception):
    """SIGTERM while following."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise _Stopped


def render(
    mode: str, log_dir: Path, watchdog_path: Path, follow: bool, colour: bool, out: TextIO
) -> int:
    """Print the logs in ``mode``; with ``follow``, keep printing what is appended
    (polling every 0.25 s) until interrupted. Returns the exit status."""
    if mode not in MODES:
        print(f"logs: unknown mode {mode!r} (expected one of {', '.join(MODES)})", file=sys.stderr)
        return 2
    server, watchdog = LogFile(log_dir / "start.out"), LogFile(watchdog_path)
    missing = {
        server: f"no server output at {server.path} (./start.sh writes it)",
        watchdog: f"no watchdog log at {watchdog.path} (no watchdog event recorded yet)",
    }
    # The watchdog file first so that, at equal times, an event precedes its log line.
    sources = {"server": [server], "watchdog": [watchdog]}.get(mode, [watchdog, server])
    if mode == "raw":
        sources = [server, watchdog]
    absent = [source for source in sources if not source.exists()]
    for source in absent:
        print(f"logs: {missing[source]}", file=sys.stderr)
    if len(absent) == len(sources) and not follow or len(absent) == len(sources) == 1:
        return 1
    restore: Callable[[], None] = lambda: None  # noqa: E731
    if follow and _in_main_thread():
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
        restore = lambda: signal.signal(signal.SIGTERM, previous)  # noqa: E731
    try:
        _emit(mode, sources, colour, out, final=not follow)
        while follow:
            time.sleep(POLL_SECONDS)
            _emit(mode, sources, colour, out, final=False)
    except (KeyboardInterrupt, _Stopped):
        return 0
    finally:
        restore()
        for source in sources:
            source.close()
    return 0


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _emit(mode: str, sources: list[LogFile], colour: bool, out: TextIO, final: bool) -> None:
    batches = [_items(mode, s, s.read_lines(final), colour) for s in sources]
    items = (i for b in batches for i in b) if mode == "raw" else _merge(batches)
    wrote = False
    for item in items:
        out.write(item.text + "\n")
        wrote = True
    if wrote:
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
