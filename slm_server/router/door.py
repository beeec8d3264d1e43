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
  closed;
* a connection with no request in progress for ``idle_timeout_seconds`` (a new one
  included) → closed.

The answers are OpenAI-shaped JSON with ``Connection: close``. We keep uvicorn's
httptools protocol (the fast parser the router was measured with) and add the checks in
its parser callbacks and ``data_received``, rather than switching to h11 (which has a
head size limit but no count, line or time limit, and costs more CPU per request).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from slm_server.errors import GatewayError
from slm_server.settings import DoorLimits


class DoorRefusal(GatewayError):
    """What the door answers (``status`` 408, 414 or 431), always closing the
    connection."""

    error_type = "invalid_request_error"

    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message, code=code)
        self.door_status = status


REASONS = {408: b"Request Timeout", 414: b"URI Too Long", 431: b"Request Header Fields Too Large"}


def refusal_bytes(refusal: DoorRefusal) -> bytes:
    body = json.dumps(refusal.body()).encode()
    reason = REASONS.get(refusal.door_status, b"Bad Request")
    return b"".join(
        [
            b"HTTP/1.1 %d %s\r\n" % (refusal.door_status, reason),
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"connection: close\r\n\r\n",
            body,
        ]
    )


class _Door(HttpToolsProtocol):
    """uvicorn's httptools protocol with :class:`DoorLimits` (set by :func:`door_protocol`)."""

    limits: DoorLimits = DoorLimits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = False
        self._head_bytes = 0
        self._url_bytes = 0
        self._header_count = 0
        self._header_bytes = 0
        self._refusal: DoorRefusal | None = None
        self._door_timer: asyncio.TimerHandle | None = None

    # -- timers ---------------------------------------------------------------

    def _arm(self, seconds: float, refusal: DoorRefusal | None) -> None:
        self._disarm()
        self._door_timer = self.loop.call_later(seconds, self._expire, refusal)

    def _disarm(self) -> None:
        if self._door_timer is not None:
            self._door_timer.cancel()
            self._door_timer = None

    def _expire(self, refusal: DoorRefusal | None) -> None:
        self._door_timer = None
        if self.transport.is_closing():
            return
        if refusal is not None:
            self.transport.write(refusal_bytes(refusal))
        self.transport.close()

    def _idle(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    # -- the protocol -----------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.limits.idle_timeout_seconds, None)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refusal is not None or self.transport.is_closing():
            return
        if not self._in_head and self._idle():
            self._in_head = True
            self._head_bytes = 0
            timeout = self.limits.header_timeout_seconds
            late = DoorRefusal(
                408, f"The request's headers did not arrive within {timeout:g}s", "header_timeout"
            )
            self._arm(timeout, late)
        if self._in_head:
            self._head_bytes += len(data)
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
        except httptools.HttpParserError:
            if self._refusal is None:  # not ours: malformed, as uvicorn answers it
                msg = "Invalid HTTP request received."
                self.logger.warning(msg)
                self.send_400_response(msg)
                return
        # Still no end of the head: every byte so far was head. Bounded here, not by
        # whatever the parser would buffer of one endless header.
        head_limit = self.limits.max_url_bytes + self.limits.max_header_bytes
        if self._refusal is None and self._in_head and self._head_bytes > head_limit:
            self._refusal = self._too_many_header_bytes()
        if self._refusal is not None:
            self._disarm()
            self.transport.write(refusal_bytes(self._refusal))
            self.transport.close()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and not self._in_head:
            self._arm(self.limits.idle_timeout_seconds, None)

    # -- parser callbacks -------------------------------------------------------

    def on_message_begin(self) -> None:
        self._url_bytes = 0
        self._header_count = 0
        self._header_bytes = 0
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        self._url_bytes += len(url)
        if self._url_bytes > self.limits.max_url_bytes:
            self._refuse(
                DoorRefusal(
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
                DoorRefusal(
                    431,
                    f"The request has more than {self.limits.max_headers} headers",
                    "too_many_headers",
                )
            )
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._disarm()
        super().on_headers_complete()

    def _too_many_header_bytes(self) -> DoorRefusal:
        return DoorRefusal(
            431,
            f"The request's headers are larger than {self.limits.max_header_bytes} bytes",
            "headers_too_large",
        )

    def _refuse(self, refusal: DoorRefusal) -> None:
        """Stop parsing: raising inside a callback makes httptools give up on the data."""
        self._refusal = refusal
        raise httptools.HttpParserError(refusal.message)


def door_protocol(limits: DoorLimits) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol class with ``limits`` enforced."""
    return type("DoorProtocol", (_Door,), {"limits": limits})
