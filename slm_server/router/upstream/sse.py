"""Server-sent events, the router's one parser for them. Pure.

:class:`SseSplitter` cuts a byte stream into whole events as they complete: lines end
in LF, CRLF or CR (a CRLF split across two reads is one line end), an event ends at a
blank line, and each byte is scanned once, so an endless event costs linear time and
at most ``max_event_bytes`` of memory before :class:`~slm_server.errors.AnswerTooLarge`.
Events come back as the bytes that arrived, line ends untouched.

:class:`SseTap` forwards a relayed stream event by event and parses the events that
can carry usage, an error or a finish reason into the request's
:class:`~slm_server.router.call.exchange.Exchange`; when the router itself asked the backend
for ``stream_options.include_usage``, the usage-only chunk it gets back is kept from a
client that never asked for it, and so are the engine's prompt progress reports
(:data:`PROGRESS_FIELD`), which come before the answer's first token. :func:`event_data`
is an event's ``data`` field and :func:`data_object` the JSON object in it, for the
router's own reading of a stream.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

from slm_server.errors import AnswerTooLarge, BackendProtocolError
from slm_server.router.call.exchange import ANSWERING, READING_PROMPT, Exchange

# The field of a chunk that only reports how much of the prompt the engine has read
# (llama-server's ``return_progress``): a sign of life for the watchdog, no part of the
# answer. Such chunks come only before the answer's first token.
PROGRESS_FIELD: Final = "prompt_progress"

_LINE_END = re.compile(rb"\r\n|\r|\n")
_FINISH_REASON: Final = b'"finish_reason"'
_STOP_TYPE: Final = b'"stop_type"'
_JSON_SPACE: Final = b" \t\n\r\f\v"  # what a regex's \s is in bytes


class SseSplitter:
    """Bytes in, whole events out (each with the blank line that ended it)."""

    def __init__(self, max_event_bytes: int) -> None:
        self.max_event_bytes = max_event_bytes
        self._parts: list[bytes] = []  # the event in progress, as it arrived
        self._size = 0
        self._line_empty = True  # nothing yet on the current line
        self._after_cr = False  # the last byte was CR: an LF next belongs to it
        self._cr_ended_event = False  # ... and that CR ended an event
        self._cr_event_size = 0  # the size of the event it ended
        self._failed: AnswerTooLarge | None = None  # to raise on the next call

    def feed(self, chunk: bytes) -> list[bytes]:
        """The events ``chunk`` completes. An event past the limit raises
        :class:`AnswerTooLarge` — at once, or, when events before it in the same chunk
        were complete, on the next call (they are returned first)."""
        if self._failed is not None:
            failed, self._failed = self._failed, None
            raise failed
        if not chunk:
            return []
        if self.take_whole(chunk):
            return [chunk]
        events: list[bytes] = []
        try:
            self._split(chunk, events)
        except AnswerTooLarge as error:
            self._parts.clear()
            self._size = 0
            if not events:
                raise
            self._failed = error
        return events

    def take_whole(self, chunk: bytes) -> bool:
        """True when ``chunk`` is one whole event by itself, as :meth:`feed` would
        return it (and now has): the common case, for callers that skip the list,
        decided without scanning line by line (nothing pending, and ``chunk`` is one
        LF-framed event within the limit whose only blank line is its last)."""
        size = len(chunk)
        if (
            # The first blank line ends the chunk (so it ends in LF LF and is not empty):
            # a one-line event has just those two LFs (counted faster than a two-byte
            # search), any other is searched for a blank line before its end.
            size > 2
            and chunk.endswith(b"\n\n")
            and (chunk.count(b"\n") == 2 or chunk.find(b"\n\n", 0, size - 1) < 0)
            and chunk[0] != 0x0A
            and chunk.find(b"\r") < 0  # not ``in``: see _worth_parsing
            and size <= self.max_event_bytes
            and not self._parts
            and self._line_empty
            and not self._after_cr
            and self._failed is None
        ):
            self._cr_event_size = size
            return True
        return False

    def _split(self, chunk: bytes, events: list[bytes]) -> None:
        if not self._after_cr and chunk.find(b"\r") < 0:  # not ``in``: see _worth_parsing
            self._split_lf(chunk, events)
        else:
            self._scan(chunk, events)

    def _split_lf(self, chunk: bytes, events: list[bytes]) -> None:
        """:meth:`_scan` for a chunk whose lines all end in LF (and no CR before it
        awaits its LF), in steps of ``bytes.find``: an event ends at the first LF that
        follows another (or begins a chunk whose line so far is empty)."""
        start = 0  # where the event in progress begins in ``chunk``
        size = len(chunk)
        while start < size:
            if self._line_empty and chunk[start] == 0x0A:
                end = start + 1  # a blank line right where a line begins
            else:
                at = chunk.find(b"\n\n", start)
                if at < 0:
                    break
                end = at + 2
            length = self._size + end - start
            self._line_empty = True  # the line after a blank one begins empty
            self._check(length)
            events.append(
                b"".join((*self._parts, chunk[start:end])) if self._parts else chunk[start:end]
            )
            self._parts.clear()
            self._size = 0
            self._cr_event_size = length
            start = end
        if start < size:
            self._line_empty = chunk[-1] == 0x0A
            self._check(self._size + size - start)
            self._parts.append(chunk[start:])
            self._size += size - start
        self._cr_ended_event = False

    def _scan(self, chunk: bytes, events: list[bytes]) -> None:
        """Line by line, whatever the line ends."""
        start = 0  # where the part of ``chunk`` not yet in an event begins
        pos = 1 if self._after_cr and chunk[:1] == b"\n" else 0
        if pos and self._cr_ended_event:
            # The LF of a CRLF whose CR ended the last event: passed on by itself.
            self._check(self._cr_event_size + 1)
            events.append(b"\n")
            start = 1
        self._after_cr = self._cr_ended_event = False
        line_start = pos
        for match in _LINE_END.finditer(chunk, pos):
            if match.start() > line_start:
                self._line_empty = False
            line_start = match.end()
            if self._line_empty:  # a blank line: the event is complete
                size = self._size + match.end() - start
                self._check(size)
                events.append(b"".join((*self._parts, chunk[start : match.end()])))
                self._parts.clear()
                self._size = 0
                self._cr_event_size = size
                start = match.end()
            self._line_empty = True
        if line_start < len(chunk):
            self._line_empty = False
        elif chunk[-1:] == b"\r":
            self._after_cr = True
            self._cr_ended_event = start == len(chunk)
        if start < len(chunk):
            self._check(self._size + len(chunk) - start)
            self._parts.append(chunk[start:])
            self._size += len(chunk) - start

    @property
    def owed(self) -> AnswerTooLarge | None:
        """The refusal :meth:`feed` owes (an event past the limit after whole ones it
        returned), raised by the next call."""
        return self._failed

    def flush(self) -> bytes:
        """Whatever trailing bytes never formed a whole event (raises a refusal
        :meth:`feed` still owes)."""
        if self._failed is not None:
            failed, self._failed = self._failed, None
            raise failed
        rest = b"".join(self._parts)
        self._parts.clear()
        self._size = 0
        self._line_empty, self._after_cr, self._cr_ended_event = True, False, False
        return rest

    def _check(self, size: int) -> None:
        if size > self.max_event_bytes:
            raise AnswerTooLarge(
                f"The backend sent a stream event larger than {self.max_event_bytes} bytes",
                code="sse_event_too_large",
            )


def event_data(event: bytes) -> bytes | None:
    """The event's ``data`` field: its ``data:`` lines joined by LF (one leading space
    of each dropped), or None when it has none."""
    lines = [line for line in _LINE_END.split(event) if line.startswith(b"data")]
    values = []
    for line in lines:
        name, colon, value = line.partition(b":")
        if name != b"data":
            continue
        values.append(value[1:] if colon and value.startswith(b" ") else value)
    return b"\n".join(values) if values else None


# What :func:`data_object` returns for ``data: [DONE]``, the end of a stream.
DONE: Final[dict[str, Any]] = {}


def data_object(event: bytes) -> dict[str, Any] | None:
    """The JSON object in an event's data; :data:`DONE` for ``[DONE]``; None for an event
    without data (a comment, a keep-alive). Raises :class:`BackendProtocolError` when
    the data is not a JSON object."""
    data = event_data(event)
    if data is None or not data.strip():
        return None
    if data.strip() == b"[DONE]":
        return DONE
    try:
        value = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise BackendProtocolError(f"the backend sent malformed stream data: {exc}") from None
    if not isinstance(value, dict):
        raise BackendProtocolError("the backend sent stream data that is not a JSON object")
    return value


def _worth_parsing(event: bytes) -> bool:
    """Whether ``event`` may say something the router records: usage, an error, a
    finish reason that is a string (not null), which ends a choice, or the end of
    llama-server's own stream (``/infill``, ``/completion``: its ``stop_type``, with
    the token counts). Searched for with
    ``bytes.find`` (a regular expression for the same cost a third of a streamed
    piece's instructions: every chunk carries ``"finish_reason":null``), and never
    with ``in``, which for bytes first tries its operand as an integer and makes and
    drops a TypeError each time."""
    if event.find(b'"usage"') >= 0 or event.find(b'"error"') >= 0:
        return True
    if event.find(_STOP_TYPE) >= 0:
        return True
    size = len(event)
    at = event.find(_FINISH_REASON)
    while at >= 0:
        i = at + len(_FINISH_REASON)
        if event.startswith(b":null", i):  # the common case: no finish yet
            at = event.find(_FINISH_REASON, i + 5)
            continue
        while i < size and event[i] in _JSON_SPACE:
            i += 1
        if i < size and event[i] == 0x3A:  # :
            i += 1
            while i < size and event[i] in _JSON_SPACE:
                i += 1
            if i < size and event[i] == 0x22:  # "
                return True
        at = event.find(_FINISH_REASON, at + 1)  # the next may begin at this one's end
    return False


def note_progress(exchange: Exchange, report: Any) -> None:
    """An engine's prompt progress report (``{"total", "cache", "processed", ...}``),
    noted as the request's stage: the prompt tokens read of the total."""
    if exchange.stage != READING_PROMPT:
        exchange.enter(READING_PROMPT)
    if isinstance(report, dict):
        processed, total = report.get("processed"), report.get("total")
        if (
            isinstance(processed, int)
            and isinstance(total, int)
            and not isinstance(processed, bool)
            and not isinstance(total, bool)
        ):
            exchange.prompt_read = (processed, total)


def is_report(exchange: Exchange, chunk: dict[str, Any]) -> bool:
    """Whether a parsed chunk is the engine's prompt progress report (noted as the
    request's stage, the router's alone); any other chunk means the answer has begun."""
    if PROGRESS_FIELD in chunk:
        note_progress(exchange, chunk[PROGRESS_FIELD])
        return True
    if exchange.stage != ANSWERING:
        exchange.enter(ANSWERING)
    return False


class SseTap:
    """Feeds a stream's events to an exchange; ``feed`` returns the bytes to forward."""

    def __init__(
        self,
        exchange: Exchange,
        drop_usage_chunk: bool,
        max_event_bytes: int,
        drop_progress: bool = False,
    ) -> None:
        self.exchange = exchange
        self.drop_usage_chunk = drop_usage_chunk
        self.drop_progress = drop_progress
        self._splitter = SseSplitter(max_event_bytes)
        self._first = True
        self.error: str | None = None

    def feed(self, chunk: bytes) -> bytes:
        if self._splitter.take_whole(chunk):  # the common case, in one step
            if not self._first and not _worth_parsing(chunk):
                return chunk
            return chunk if self._inspect(chunk) else b""
        events = self._splitter.feed(chunk)
        if len(events) == 1 and not self._first and not _worth_parsing(events[0]):
            return events[0]
        return b"".join(e for e in events if self._inspect(e))

    def flush(self) -> bytes:
        """Whatever trailing bytes never formed a whole event."""
        return self._splitter.flush()

    def restart(self) -> None:
        """A new response goes on in place of a broken one: the broken one's last,
        partial event is dropped."""
        self._splitter = SseSplitter(self._splitter.max_event_bytes)

    @property
    def owed(self) -> AnswerTooLarge | None:
        """A refusal the stream is owed already (:attr:`SseSplitter.owed`)."""
        return self._splitter.owed

    def _inspect(self, event: bytes) -> bool:
        """Parse an event if it may matter; False when it is to be kept from the client."""
        first, self._first = self._first, False
        if not first and not _worth_parsing(event):
            return True
        data = event_data(event)
        body = None
        if data and data.strip() != b"[DONE]":
            try:
                body = json.loads(data)
            except (ValueError, RecursionError):
                body = None
        if first and self.drop_progress and isinstance(body, dict) and PROGRESS_FIELD in body:
            self._first = True  # still before the answer: the next event is looked at too
            note_progress(self.exchange, body[PROGRESS_FIELD])
            return False
        if first:  # whatever it is, the client sees it: the answer has begun
            self.exchange.enter(ANSWERING)
        if not isinstance(body, dict):
            return True
        error = body.get("error")
        if error is not None:
            message = error.get("message") if isinstance(error, dict) else error
            self.error = str(message)
        self.exchange.note_response(body)
        usage_only = body.get("choices") == [] and isinstance(body.get("usage"), dict)
        return not (self.drop_usage_chunk and usage_only)
