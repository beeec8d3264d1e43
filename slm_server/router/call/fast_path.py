"""The router's fast path, as the rest of the router sees it: what the server serving a
request, and the backend response answering it, can do beyond plain ASGI and plain
reads. The router asks these two interfaces, never the concrete types behind them.

* :class:`FastPath`: one request's connection to its client, offered by the door
  (:mod:`slm_server.router.edge.http_protocol`) in ``scope["extensions"]`` under
  :data:`FAST_PATH`, found with :func:`fast_path_of`: whether the client is still
  there (told the moment the connection is lost), the request body taken whole when it
  has all arrived, a whole answer written in one write, and a stream's pieces written
  without an ASGI message each. Where no door serves the request (plain ASGI, as an
  in-process client drives the app) :func:`fast_path_of` is None and everything goes
  through ASGI's ``receive`` and ``send``; each method also answers None or False when
  its way is closed for this request, and the caller falls back to ASGI then.
* :class:`SpliceSource`: a backend response's body handed piece by piece to a callback
  as the upstream connection parses it (:class:`slm_server.http1.Response`), which an
  upstream response offers through its ``spliceable()``
  (:class:`~slm_server.router.upstream.client.UpstreamResponse`); None there, and the
  stream is read with ``receive`` instead.

A stream is spliced (:class:`~slm_server.router.answer.stream_splice.Splice`) when both
sides offer theirs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from starlette.types import Scope

FAST_PATH = "slm.fast_path"


class PieceWriter(Protocol):
    """Writes a started stream's body pieces straight to the client's connection."""

    def write(self, body: bytes) -> bool:
        """Send ``body`` as one piece; False, with nothing sent, when it cannot go this
        way (the client left, the response is not a started chunked one, or ended)."""
        ...

    @property
    def full(self) -> bool:
        """The client reads slower than it is written to: wait for :meth:`drain`."""
        ...

    async def drain(self) -> None:
        """Until the connection's write buffer has room (or the client left)."""
        ...


class FastPath(PieceWriter, Protocol):
    """One request's connection to its client, beyond ASGI (see the module docstring).

    ``on_gone`` is called (once, then forgotten) when the connection is lost before the
    request's response ended."""

    on_gone: Callable[[], None] | None

    @property
    def gone(self) -> bool:
        """The client has left (its connection is lost) before the response ended."""
        ...

    def take_body(self) -> bytes | None:
        """For the first read of the body: all of it when all of it is in, as ASGI's
        ``receive`` would have handed it over; None when it cannot be had this way
        (more is to come, the client left or waits for ``100 Continue``): read it
        through ASGI then."""
        ...

    async def answer(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> bool:
        """Answer the request whole, status line, headers (lowercase names, after the
        server's own) and body in one write; False, with nothing sent, when this answer
        cannot go this way (a response already begun, a HEAD, a status with no body):
        send it through ASGI then. A header value with a control character, or a
        ``content-length`` that is not the body's, raises RuntimeError before anything
        is sent."""
        ...

    @property
    def writable(self) -> bool:
        """The response has started, chunked, and is not a HEAD's: its pieces can go by
        :meth:`write` (asked once, before the first)."""
        ...


def fast_path_of(scope: Scope) -> FastPath | None:
    """The request's :class:`FastPath`, None when no door serves it (plain ASGI)."""
    extensions = scope.get("extensions")
    found: FastPath | None = None if extensions is None else extensions.get(FAST_PATH)
    return found


class SpliceSource(Protocol):
    """A backend response's body, handed to a callback piece by piece as the connection
    parses it (see the module docstring)."""

    def splice(self, sink: Callable[[bytes], None]) -> None:
        """From now on hand each piece of the body to ``sink`` as it is parsed (what
        arrived already first); ``sink`` must not raise."""
        ...

    def unsplice(self) -> None:
        """Keep the body's pieces for ``receive`` again."""
        ...

    def pause(self) -> None:
        """Stop reading the body (its consumer is full); a :meth:`settle` under way
        returns."""
        ...

    def resume(self) -> None:
        """Read the body again after :meth:`pause`."""
        ...

    async def settle(self) -> bool:
        """Wait until the body is complete (True, the response closed) or reading is
        paused (False); a broken body raises its
        :class:`~slm_server.http1.HttpError` (or a gateway error). Each wait for the
        next bytes is bounded by the read timeout."""
        ...


__all__ = ["FAST_PATH", "FastPath", "PieceWriter", "SpliceSource", "fast_path_of"]
