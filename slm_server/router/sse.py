"""A tap on a relayed server-sent-events stream. Pure.

Bytes are cut into whole events (``\\n\\n``-terminated) and forwarded event by event;
events that can carry usage or a finish reason are parsed into the request's
:class:`~slm_server.router.exchange.Exchange`. When the router itself asked the backend
for ``stream_options.include_usage``, the usage-only chunk it gets back is kept from a
client that never asked for it.
"""

from __future__ import annotations

import json
import re

from slm_server.router.exchange import Exchange

# A finish reason that is a string (not null): the event that ends a choice.
_FINISHED = re.compile(rb'"finish_reason"\s*:\s*"')


def _worth_parsing(event: bytes) -> bool:
    if b'"usage"' in event or b'"error"' in event:
        return True
    return _FINISHED.search(event) is not None


class SseTap:
    """Feeds a stream's events to an exchange; ``feed`` returns the bytes to forward."""

    def __init__(self, exchange: Exchange, drop_usage_chunk: bool) -> None:
        self.exchange = exchange
        self.drop_usage_chunk = drop_usage_chunk
        self._pending = b""
        self._first = True
        self.error: str | None = None

    def feed(self, chunk: bytes) -> bytes:
        data = self._pending + chunk
        cut = data.rfind(b"\n\n")
        if cut < 0:
            self._pending = data
            return b""
        complete, self._pending = data[: cut + 2], data[cut + 2 :]
        if not self._first and not _worth_parsing(complete):
            return complete
        kept = [e for e in complete.split(b"\n\n")[:-1] if self._inspect(e)]
        return b"".join(e + b"\n\n" for e in kept)

    def flush(self) -> bytes:
        """Whatever trailing bytes never formed a whole event."""
        rest, self._pending = self._pending, b""
        return rest

    def _inspect(self, event: bytes) -> bool:
        """Parse an event if it may matter; False when it is to be kept from the client."""
        first, self._first = self._first, False
        if not first and not _worth_parsing(event):
            return True
        body = None
        for line in event.split(b"\n"):
            if line.startswith(b"data:"):
                payload = line[5:].strip()
                if payload and payload != b"[DONE]":
                    try:
                        body = json.loads(payload)
                    except ValueError:
                        body = None
        if not isinstance(body, dict):
            return True
        error = body.get("error")
        if error is not None:
            message = error.get("message") if isinstance(error, dict) else error
            self.error = str(message)
        self.exchange.note_response(body)
        usage_only = body.get("choices") == [] and isinstance(body.get("usage"), dict)
        return not (self.drop_usage_chunk and usage_only)
