"""Answering a request with a :class:`~slm_server.errors.GatewayError` from pure-ASGI
middleware, before any route runs (the routes' own errors go through Starlette's
exception handlers), in the shape its path's clients expect (OpenAI's, or Anthropic's
on the Messages API: :class:`~slm_server.router.call.error_shape.Dialect`)."""

from __future__ import annotations

import json

from starlette.types import Scope, Send

from slm_server.errors import GatewayError
from slm_server.router.call.error_shape import error_body
from slm_server.router.call.exchange import exchange_of


async def reject(scope: Scope, send: Send, error: GatewayError) -> None:
    """Send ``error`` as the whole response, noted on the request's exchange."""
    exchange = exchange_of(scope)
    exchange.note_error(error)
    body = json.dumps(error_body(error, exchange.errors)).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    headers += [(k.lower().encode(), v.encode()) for k, v in error.headers().items()]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
