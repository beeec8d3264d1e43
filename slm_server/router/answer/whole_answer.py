"""A whole answer: a status, a content type, a body and any extra headers, sent to the
client in one piece.

Where the door serves the request (its
:class:`~slm_server.router.call.fast_path.FastPath` in the scope), it goes out in one
write with no ASGI message: the request's exchange is given its status and the answer
carries the headers the router adds (``answer_headers``: the request id...), as the
:class:`~slm_server.router.observe.observer.RequestObserver` does for a response sent
through ASGI. Elsewhere (plain ASGI) it is the two messages a Starlette ``Response``
sends, with the same headers.
"""

from __future__ import annotations

from collections.abc import Mapping

from starlette.types import Receive, Scope, Send

from slm_server.router.call.exchange import Exchange, answer_headers
from slm_server.router.call.fast_path import fast_path_of


class WholeAnswer:
    """An ASGI application answering ``body`` with ``status_code`` as ``media_type``,
    with the headers a Starlette ``Response`` sends, in its order: the extra ones,
    ``content-length`` (none for a status that has no body) and ``content-type``
    (``; charset=utf-8`` added to a ``text/`` type without one)."""

    __slots__ = ("body", "exchange", "headers", "status_code")

    def __init__(
        self,
        exchange: Exchange,
        body: bytes,
        status_code: int,
        media_type: str,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.exchange = exchange
        self.body = body
        self.status_code = status_code
        if media_type.startswith("text/") and "charset=" not in media_type.lower():
            media_type += "; charset=utf-8"
        raw = [
            (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()
        ]
        if not (status_code < 200 or status_code in (204, 304)):
            raw.append((b"content-length", b"%d" % len(body)))
        raw.append((b"content-type", media_type.encode("latin-1")))
        self.headers = raw

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        door = fast_path_of(scope)
        if door is not None:
            exchange = self.exchange
            status = self.status_code
            # Noted before the write, as the observer notes it before ASGI's send: a
            # write that waits on a full client and is cancelled keeps it.
            exchange.status = status
            try:
                sent = await door.answer(
                    status, [*self.headers, *answer_headers(exchange)], self.body
                )
            except RuntimeError:
                exchange.status = None  # nothing went out: the error's answer will
                raise
            if sent:
                exchange.answered = True
                return
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.headers}
        )
        await send({"type": "http.response.body", "body": self.body})


__all__ = ["WholeAnswer"]
