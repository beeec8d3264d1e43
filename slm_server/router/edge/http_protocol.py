"""Limits at the door: what a client may send before the router reads any body or key.

uvicorn's httptools protocol sets no limit on the request line, on the size or number
of headers, or on the time a client may take to send them, and closes an idle
connection only after it has answered a request on it.
:class:`~slm_server.settings.DoorLimits` are the limits; :func:`door_protocol` is
uvicorn's httptools protocol with them enforced:

* a request line (the URL) longer than ``max_url_bytes`` → 414, connection closed;
* a header section larger than ``max_header_bytes``, or with more than ``max_headers``
  headers → 431, closed; the bytes of an unfinished head are counted as they arrive,
  so memory is bounded whatever one header's length;
* a head not complete within ``header_timeout_seconds`` of its first byte → 408,
  closed; a request body with no byte for ``body_stall_seconds`` → 408 (or, when the
  response has begun, just closed), so a body declared and never sent cannot hold the
  budget for bodies in flight;
* a connection with no request in progress for ``idle_timeout_seconds`` (a new one
  included) → closed;
* a connection whose write buffer is past the high-water mark and whose client takes
  none of it for ``write_stall_seconds`` → aborted, the unsent bytes dropped (a client
  that takes some within each period is reading, however slowly): a client that asks
  and never reads cannot hold a connection, its buffered answer or a stream's task for
  ever (a plain close would wait for the buffer to drain).

The answers are OpenAI-shaped JSON with ``Connection: close``.

A response that states its ``Content-Length`` (every whole answer) goes out in one
write, status line, headers and body together (:class:`HeldTransport`), where
uvicorn writes the head and the body separately: one system call and one segment
fewer per answer. Streams are untouched: their head goes out at once.

Each request's ``scope["extensions"]`` carries its :class:`DoorRequest` under
:data:`~slm_server.router.call.fast_path.FAST_PATH`, the door's side of the router's
fast path (:class:`~slm_server.router.call.fast_path.FastPath`, the interface the rest
of the router uses; it never names this module's types):

* the client's presence: the door calls its listener the moment the connection is
  lost, so the router hears of a client leaving without a task per request waiting on
  ASGI's ``receive`` for the ``http.disconnect``;
* a request body that has all arrived by the time the router reads it is taken from
  the cycle in one piece, as ASGI's ``receive`` would have handed it over, without the
  message;
* a whole answer is written straight to the connection, status line, headers and body
  in one write, with no ASGI message at all: the router's whole answers use it, and
  the cycle is left as uvicorn's ``send`` leaves it after the same two messages;
* a stream's body pieces are written straight to the connection, framed as uvicorn
  frames them, without an ASGI message each: the router's stream relay uses it to
  splice a backend's pieces to the client as they are parsed.

The object lives in the scope of uvicorn's cycle and holds the cycle by a weak
reference (it lives as long as its request's task, or its connection's next request):
a strong one would make every finished request a loop of scope and cycle that only the
cyclic collector frees.

We keep uvicorn's
httptools protocol (the fast parser the router was measured with) and add the checks in
its parser callbacks and ``data_received``, rather than switching to h11 (which has a
head size limit but no count, line or time limit, and costs more CPU per request).

What this module relies on in uvicorn, none of it public API (so ``pyproject.toml`` pins
uvicorn to the minor release it was written against, 0.39, and
``tests/unit/router/edge/test_http_protocol_uvicorn_contract.py`` checks every item below
on real instances, and that this list covers what the source touches):

* imported: ``CLOSE_HEADER`` (``flow_control``), ``HEADER_VALUE_RE``, ``STATUS_LINE``,
  ``HttpToolsProtocol``, ``RequestResponseCycle`` (``httptools_impl``);
* ``HttpToolsProtocol``'s ``__init__`` (config, server_state, app_state, _loop),
  ``connection_made``, ``connection_lost``, ``pause_writing``, ``resume_writing``,
  ``on_response_complete`` and the parser callbacks ``on_message_begin``, ``on_url``,
  ``on_header``, ``on_headers_complete``, ``on_body``, ``on_message_complete``, all
  overridden and called through ``super()``; ``data_received``, replaced (what it does
  is redone here); its fields ``loop``, ``transport``, ``parser``, ``cycle`` (the
  newest request's: a pipelined request takes it from one still answering),
  ``pipeline``, ``logger``, ``url``, ``headers`` (the scope's own list, rewritten for
  an absolute-form target); its methods ``_should_upgrade``,
  ``handle_websocket_upgrade``, ``_unsupported_upgrade_warning``,
  ``send_400_response`` and ``_unset_keepalive_if_required``;
* ``RequestResponseCycle``'s ``scope``, ``transport`` (replaced by the connection's
  :class:`HeldTransport`), ``flow`` (its ``write_paused``, ``drain`` and
  ``resume_reading``), ``default_headers``, ``message_event``, ``on_response``,
  ``disconnected``, ``keep_alive``, ``waiting_for_100_continue``, ``body``,
  ``more_body``, ``response_started``, ``response_complete``, ``chunked_encoding``
  and ``expected_content_length``: :class:`DoorRequest` reads and writes them as
  uvicorn's ``receive`` and ``send`` do, so that after the fast path the cycle is
  what uvicorn's own messages would have left (keep-alive, the next pipelined
  request, a lost connection's disconnect all depend on it).
"""

from __future__ import annotations

import asyncio
import json
import logging
import weakref
from collections.abc import Callable
from typing import Any, cast

import httptools
from uvicorn.protocols.http.flow_control import CLOSE_HEADER
from uvicorn.protocols.http.httptools_impl import (
    HEADER_VALUE_RE,
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)

from slm_server.errors import HttpStatusError
from slm_server.router.apis.table import TABLE
from slm_server.router.call.error_shape import error_body
from slm_server.router.call.fast_path import FAST_PATH
from slm_server.router.edge.alarm import Alarm
from slm_server.settings import DoorLimits

log = logging.getLogger("slm_server.router")

REASONS = {408: b"Request Timeout", 414: b"URI Too Long", 431: b"Request Header Fields Too Large"}


def refusal_bytes(refusal: HttpStatusError, target: bytes = b"") -> bytes:
    """The whole response to a request the door refuses, its body in the error shape of
    the path the request ``target`` names (as far as it arrived)."""
    body = json.dumps(error_body(refusal, TABLE.dialect_at(_path_of(target)))).encode()
    reason = REASONS.get(refusal.status, b"Bad Request")
    return b"".join(
        [
            b"HTTP/1.1 %d %s\r\n" % (refusal.status, reason),
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"connection: close\r\n\r\n",
            body,
        ]
    )


def _path_of(target: bytes) -> str:
    """The path of a request target (origin or absolute form), without its query."""
    if target[:8].lower().startswith((b"http://", b"https://")):
        parts = target.split(b"/", 3)
        target = b"/" + parts[3] if len(parts) > 3 else b"/"
    return target.split(b"?", 1)[0].decode("latin-1")


class HeldTransport:
    """The connection's transport as its requests' cycles see it: the head of a
    response that states its ``Content-Length`` is kept and sent together with the
    next write (its body), or on the loop's next turn, or before the transport closes,
    whichever comes first. Everything else is the real transport's."""

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes) -> None:
        held = self._held
        if held is not None:
            self._held = None
            data = held + data
        elif data[:5] == b"HTTP/" and data.find(LENGTH_LINE) >= 0:  # not ``in``: no TypeError
            # uvicorn writes a response's head by itself, header names lowercased.
            self._held = data
            self._loop.call_soon(self.flush)
            return
        self._transport.write(data)

    def unheld(self) -> asyncio.Transport:
        """The real transport, with nothing kept back for it."""
        if self._held is not None:
            self.flush()
        return self._transport

    def flush(self) -> None:
        """Send a kept head now."""
        held, self._held = self._held, None
        if held is not None:
            self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


LENGTH_LINE = b"\r\ncontent-length: "


class DoorRequest:
    """One request's :class:`~slm_server.router.call.fast_path.FastPath`: it lives in
    the scope of uvicorn's cycle and holds that cycle weakly (see the module
    docstring). Each way leaves the cycle as uvicorn's ``receive`` or ``send`` leaves
    it after the same messages."""

    __slots__ = ("_cycle", "_raw", "on_gone")

    def __init__(self, cycle: RequestResponseCycle) -> None:
        self._cycle = weakref.ref(cycle)
        self._raw: asyncio.Transport | None = None  # the real transport, once written to
        self.on_gone: Callable[[], None] | None = None

    # -- the client's presence ------------------------------------------------------

    @property
    def gone(self) -> bool:
        """The door calls :attr:`on_gone` (once, then forgets it) when the connection is
        lost before the request's response ended; a response that ended has no client
        left to lose."""
        cycle = self._cycle()  # None once its request is over: no client left to lose
        return cycle is not None and cycle.disconnected

    def lost(self) -> None:
        on_gone, self.on_gone = self.on_gone, None
        if on_gone is not None:
            on_gone()

    # -- the request body -----------------------------------------------------------

    def take_body(self) -> bytes | None:
        """For the first read of the body: all of it, leaving the cycle as uvicorn's
        ``receive`` leaves it after handing over a last ``http.request`` message
        (reading resumed); None when it cannot be had this way (more is to come, the
        client left or waits for ``100 Continue``): read it through ASGI then."""
        cycle = self._cycle()
        if (
            cycle is None
            or cycle.more_body
            or not cycle.message_event.is_set()
            or cycle.disconnected
            or cycle.response_complete
            or cycle.waiting_for_100_continue
        ):
            return None
        body, cycle.body = cycle.body, b""
        cycle.message_event.clear()
        cycle.flow.resume_reading()
        return body

    # -- a whole answer -------------------------------------------------------------

    async def answer(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> bool:
        """Answer with ``status``, ``headers`` (lowercase names, written in their order
        after the server's own; a ``content-length`` among them must be the body's) and
        ``body``, in one write, leaving the cycle as uvicorn's ``send`` leaves it after
        an ``http.response.start`` and a last ``http.response.body``: the server's
        default headers first, ``connection: close`` when the client asked for it (and
        the connection closed after), flow control waited on, nothing written once the
        client has left, the protocol told the response is complete. False, with
        nothing sent, when this answer cannot go this way (a response already begun, a
        HEAD, a status with no body): send it through ASGI then. A header value with a
        control character, or a length that is not the body's, is a RuntimeError as in
        uvicorn's ``send``, raised before anything is sent or marked sent (so an error
        answer can still go out)."""
        cycle = self._cycle()
        if cycle is None:
            return True  # its connection and request are gone: nobody is left to answer
        if (
            cycle.response_started
            or status not in STATUS_LINE
            or status < 200
            or status in (204, 304)
            or cycle.scope["method"] == "HEAD"
        ):
            return False
        if cycle.flow.write_paused and not cycle.disconnected:
            await cycle.flow.drain()
        if cycle.disconnected:
            return True  # as uvicorn's send: nobody is left to answer
        content = [STATUS_LINE[status]]
        for name, value in cycle.default_headers:
            content += (name, b": ", value, b"\r\n")
        close = False
        for name, value in headers:
            if HEADER_VALUE_RE.search(value):
                raise RuntimeError("Invalid HTTP header value.")
            if name == b"content-length" and value != b"%d" % len(body):
                raise RuntimeError("Response content length is not the body's")
            if name == b"connection" and value.lower() == b"close":
                close = True
            content += (name, b": ", value, b"\r\n")
        if CLOSE_HEADER in cycle.scope["headers"] and not close:
            content.append(b"connection: close\r\n")
            close = True
        content += (b"\r\n", body)
        if close:
            cycle.keep_alive = False
        cycle.response_started = True
        cycle.waiting_for_100_continue = False
        cycle.chunked_encoding = False
        cycle.expected_content_length = 0
        transport = cycle.transport
        if isinstance(transport, HeldTransport):
            transport = transport.unheld()
        transport.write(b"".join(content))
        cycle.response_complete = True
        cycle.message_event.set()
        if not cycle.keep_alive:
            transport.close()
        cycle.on_response()
        return True

    # -- a stream's pieces ----------------------------------------------------------

    def write(self, body: bytes) -> bool:
        """Send ``body`` as one chunk of a chunked response already started through
        ASGI, framed as uvicorn frames it; False when it cannot go this way (the client
        left, the response is not a started chunked one), and nothing was sent. The
        response still ends with an ASGI ``http.response.body`` message (uvicorn writes
        the last chunk and decides on keep-alive)."""
        cycle = self._cycle()
        if cycle is None or cycle.disconnected or cycle.response_complete:
            return False
        transport = self._raw
        if transport is None:
            if not self.writable:
                return False
            transport = cycle.transport
            if isinstance(transport, HeldTransport):
                transport = transport.unheld()  # a stream's head is never held
            self._raw = transport
        transport.write(b"%x\r\n%b\r\n" % (len(body), body))
        return True

    @property
    def writable(self) -> bool:
        """The response has started, chunked, and is not a HEAD's: its pieces can go
        this way (asked once, before the first; after it only the client's leaving or
        the response's end refuse a piece)."""
        cycle = self._cycle()
        return (
            cycle is not None
            and cycle.response_started
            and bool(cycle.chunked_encoding)
            and cycle.scope["method"] != "HEAD"
            and not cycle.disconnected
            and not cycle.response_complete
        )

    @property
    def full(self) -> bool:
        """The client reads slower than it is written to: wait for :meth:`drain`."""
        cycle = self._cycle()
        return cycle is not None and cycle.flow.write_paused and not cycle.disconnected

    async def drain(self) -> None:
        """Until the connection's write buffer has room (or the client left)."""
        cycle = self._cycle()
        if cycle is not None and cycle.flow.write_paused and not cycle.disconnected:
            await cycle.flow.drain()


def door_request_of(cycle: RequestResponseCycle) -> DoorRequest | None:
    door = cycle.scope.get("extensions", {}).get(FAST_PATH)
    return door if isinstance(door, DoorRequest) else None


# Bytes fed to the parser at a time outside a Content-Length body, so what a head (or a
# chunked body's trailer) has cost is known to within this much, pipelined or not.
SLICE = 4096


class _Door(HttpToolsProtocol):
    """uvicorn's httptools protocol with :class:`DoorLimits` (set by :func:`door_protocol`).

    The parser's own callbacks say where the connection is: ``idle`` between messages,
    ``head`` from a message's first byte to the end of its headers (the header timer
    runs, its bytes are counted), ``body`` until the message is complete (the body stall
    timer runs; a chunked body's bytes beyond what it delivers, its framing and trailer,
    are counted). The idle timer runs only while no message is being read and no
    response is being sent, pipelined ones included."""

    limits: DoorLimits = DoorLimits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._phase = "idle"
        self._head_bytes = 0
        self._url_bytes = 0
        self._header_count = 0
        self._header_bytes = 0
        self._chunked = False
        self._body_fed = 0
        self._body_delivered = 0
        self._refusal: HttpStatusError | None = None
        # The head's, the body's or the idle deadline: one at a time.
        self._alarm = Alarm(self.loop)
        # While the client's write buffer is full: how long it may go without taking
        # any of it, and how much was unsent when that was last looked at.
        self._write_alarm = Alarm(self.loop)
        self._unsent_at_check = 0
        # Cycles a pipelined request took uvicorn's ``cycle`` from before their
        # response ended: uvicorn tells only its newest of a lost connection.
        self._superseded: list[RequestResponseCycle] = []
        self._held: HeldTransport | None = None

    # -- timers ---------------------------------------------------------------

    def _cancel_all(self) -> None:
        self._alarm.cancel()
        self._write_alarm.cancel()

    def _arm_idle(self) -> None:
        if self._phase == "idle" and not self.pipeline and self._responded():
            self._alarm.set(self.limits.idle_timeout_seconds, self._close_idle)
        else:
            self._stop_idle()

    def _stop_idle(self) -> None:
        if self._alarm.action == self._close_idle:
            self._alarm.clear()

    def _responded(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _close_idle(self) -> None:
        if not self.transport.is_closing():
            self.transport.close()

    def _head_late(self) -> None:
        timeout = self.limits.header_timeout_seconds
        self._answer_and_close(
            HttpStatusError(
                408, f"The request's headers did not arrive within {timeout:g}s", "header_timeout"
            )
        )

    def _body_late(self) -> None:
        stall = self.limits.body_stall_seconds
        self._answer_and_close(
            HttpStatusError(408, f"No byte of the request body for {stall:g}s", "body_timeout")
        )

    def _write_late(self) -> None:
        """A stall period passed with the buffer full: cut, unless the client took some
        of it meanwhile (a slow reader of a large answer is still reading)."""
        stall = self.limits.write_stall_seconds
        unsent = self.transport.get_write_buffer_size()
        if unsent < self._unsent_at_check:
            self._unsent_at_check = unsent
            self._write_alarm.set(stall, self._write_late)
            return
        log.info(
            "closed a connection whose client read nothing of its answer for %gs "
            "(SLM_WRITE_STALL_SECONDS)",
            stall,
        )
        self.transport.abort()

    def _answer_and_close(self, refusal: HttpStatusError) -> None:
        """Answer ``refusal`` unless a response is already under way, and close."""
        if self.transport.is_closing():
            return
        self._refusal = refusal
        # The head being read has a cycle of its own only once it is complete: until
        # then ``cycle`` is the previous request's, whose response must have ended.
        if self._phase == "head":
            answer = self._responded()
        else:
            answer = self.cycle is None or not self.cycle.response_started
        if answer:
            self.transport.write(refusal_bytes(refusal, self.url))
        # The write-stall alarm stays: a close waits for a buffer the client may never
        # take, and only that alarm ends the wait.
        self._alarm.cancel()
        self.transport.close()

    # -- the protocol -----------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_idle()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_all()
        # A stream running ahead of a pipelined request must hear of it too, or it
        # relays into a dead connection.
        lost = [cycle for cycle in self._superseded if not cycle.response_complete]
        self._superseded.clear()
        for cycle in lost:
            cycle.disconnected = True
            cycle.message_event.set()
        current = self.cycle
        if current is not None and not current.response_complete:
            lost.append(current)
        super().connection_lost(exc)
        for cycle in lost:
            door = door_request_of(cycle)
            if door is not None:
                door.lost()

    def pause_writing(self) -> None:
        super().pause_writing()
        self._unsent_at_check = self.transport.get_write_buffer_size()
        self._write_alarm.set(self.limits.write_stall_seconds, self._write_late)

    def resume_writing(self) -> None:
        self._write_alarm.clear()
        super().resume_writing()

    def data_received(self, data: bytes) -> None:
        if self._refusal is not None or self.transport.is_closing() or not data:
            return
        self._stop_idle()
        self._unset_keepalive_if_required()
        if self._phase == "body":
            self._restart_body_timer()
        pos = 0
        while pos < len(data) and self._refusal is None:
            whole = self._phase == "body" and not self._chunked
            piece = data[pos:] if whole else data[pos : pos + SLICE]
            pos += len(piece)
            phase = self._phase
            if not self._feed(piece):
                return
            self._count(phase, piece)
        if self._refusal is not None and not self.transport.is_closing():
            self._answer_and_close(self._refusal)

    def _feed(self, piece: bytes) -> bool:
        """Give ``piece`` to the parser; False when the connection was dealt with."""
        try:
            self.parser.feed_data(piece)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return False
        except httptools.HttpParserError:
            if self._refusal is None:  # not ours: malformed, as uvicorn answers it
                msg = "Invalid HTTP request received."
                self.logger.warning(msg)
                self.send_400_response(msg)
                return False
        return True

    def _count(self, phase_before: str, piece: bytes) -> None:
        """Charge ``piece`` to the head or the chunked body it was fed in (the phase it
        began in, or the one it ended in: a piece that starts a head counts whole)."""
        if self._refusal is not None:
            return
        if self._phase == "head" or phase_before == "head":
            self._head_bytes += len(piece)
            if self._phase == "head":
                limit = self.limits.max_url_bytes + self.limits.max_header_bytes
                if self._head_bytes > limit:
                    self._refusal = self._too_many_header_bytes()
        elif self._phase == "body" and self._chunked:
            self._body_fed += len(piece)
            framing = self._body_fed - self._body_delivered
            allowed = self.limits.max_header_bytes + self._body_delivered // 4 + SLICE
            if framing > allowed:
                self._refusal = HttpStatusError(
                    431,
                    "The request's chunked body carries more than "
                    f"{self.limits.max_header_bytes} bytes of framing and trailer",
                    "trailer_too_large",
                )

    def _restart_body_timer(self) -> None:
        self._alarm.set(self.limits.body_stall_seconds, self._body_late)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_idle()

    # -- parser callbacks -------------------------------------------------------

    def on_message_begin(self) -> None:
        self._phase = "head"
        self._head_bytes = 0
        self._url_bytes = 0
        self._header_count = 0
        self._header_bytes = 0
        self._alarm.set(self.limits.header_timeout_seconds, self._head_late)
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        self._url_bytes += len(url)
        if self._url_bytes > self.limits.max_url_bytes:
            self._refuse(
                HttpStatusError(
                    414,
                    f"The request line is longer than {self.limits.max_url_bytes} bytes",
                    "url_too_long",
                )
            )
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        self._header_bytes += len(name) + len(value) + 4  # ": " and CRLF
        if self._header_bytes > self.limits.max_header_bytes:
            self._refuse(self._too_many_header_bytes())
        if self._header_count > self.limits.max_headers:
            self._refuse(
                HttpStatusError(
                    431,
                    f"The request has more than {self.limits.max_headers} headers",
                    "too_many_headers",
                )
            )
        if self._phase == "head":  # trailers are counted as body framing instead
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        url = self.url.lower()
        if url.startswith((b"http://", b"https://")):
            # An absolute-form target (RFC 9112 3.2.2): its authority is the request's
            # host, whatever Host says, so that is what the Host check must see.
            authority = self.url.split(b"/", 3)[2]
            self.headers[:] = [(n, v) for n, v in self.headers if n != b"host"]
            self.headers.append((b"host", authority))
        self._phase = "body"
        self._chunked = any(
            n == b"transfer-encoding" and b"chunked" in v.lower() for n, v in self.headers
        )
        self._body_fed = self._body_delivered = 0
        self._restart_body_timer()
        before = self.cycle
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle is not before:
            # The cycle writes through the connection's HeldTransport (made on first
            # use: uvicorn sets ``transport`` in ``connection_made``).
            held = self._held
            if held is None:
                held = self._held = HeldTransport(self.transport, self.loop)
            cycle.transport = held  # type: ignore[assignment]
            extensions = cast(dict[str, Any], cycle.scope.setdefault("extensions", {}))
            extensions[FAST_PATH] = DoorRequest(cycle)
            if before is not None and not before.response_complete:  # pipelined
                superseded = self._superseded
                superseded[:] = [c for c in superseded if not c.response_complete]
                superseded.append(before)

    def on_body(self, body: bytes) -> None:
        self._body_delivered += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._phase = "idle"
        if self._alarm.action == self._body_late:
            self._alarm.clear()
        super().on_message_complete()
        self._arm_idle()

    def _too_many_header_bytes(self) -> HttpStatusError:
        return HttpStatusError(
            431,
            f"The request's headers are larger than {self.limits.max_header_bytes} bytes",
            "headers_too_large",
        )

    def _refuse(self, refusal: HttpStatusError) -> None:
        """Stop parsing: raising inside a callback makes httptools give up on the data."""
        self._refusal = refusal
        raise httptools.HttpParserError(refusal.message)


def door_protocol(limits: DoorLimits) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol class with ``limits`` enforced."""
    return type("DoorProtocol", (_Door,), {"limits": limits})
