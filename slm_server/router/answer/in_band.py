"""An answer that comes after its stream's head went out (keep-alives were sent while
the request waited: :mod:`slm_server.router.call.keepalive`): a stream goes on where
the keep-alives left it; anything else — a refusal, a backend's error, an answer in one
piece — can no longer change the status, and is told in band, in the API shape's own
way, as an error that ends the stream (:class:`InBand`)."""

from __future__ import annotations

import json
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from slm_server.errors import GatewayError, HttpStatusError
from slm_server.router.answer.stream_relay import StreamRelay

MAX_MESSAGE_CHARS = 2000


class InBand:
    """The end of a stream whose head went out already: ``body`` (an error event in
    the shape's own way), then the end of the body."""

    __slots__ = ("body",)

    def __init__(self, body: bytes) -> None:
        self.body = body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.body", "body": self.body, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def going_on(answer: ASGIApp) -> StreamRelay | GatewayError:
    """``answer`` made to go on with a stream whose head went out: a relayed stream
    (its own head not sent again), else the error it is told as."""
    if isinstance(answer, StreamRelay):
        if "content-encoding" in answer.headers:
            return GatewayError(
                "The backend encoded its stream after the router had begun it; ask again "
                "without Accept-Encoding",
                code="upstream_encoded",
            )
        answer.started = True
        return answer
    status = getattr(answer, "status_code", 500)
    body = getattr(answer, "body", b"")
    status = status if isinstance(status, int) else 500
    message = _message(body if isinstance(body, bytes) else b"")
    if status < 400:
        return GatewayError(
            "The backend answered in one piece after the stream had begun: "
            + (message or "(no message)"),
            code="backend_not_streamed",
        )
    if status < 500:
        return HttpStatusError(status, message or f"HTTP {status}", code="backend_refused")
    error = GatewayError(message or f"HTTP {status}", code="backend_error")
    error.status = status
    return error


def _message(body: bytes) -> str:
    """The message of an error body (OpenAI's, Anthropic's, a plain ``{"error": ...}``),
    else its text, cut to a bound."""
    try:
        data: Any = json.loads(body)
    except (ValueError, RecursionError):
        return body.decode("utf-8", "replace")[:MAX_MESSAGE_CHARS]
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])[:MAX_MESSAGE_CHARS]
        if isinstance(error, str):
            return error[:MAX_MESSAGE_CHARS]
    return body.decode("utf-8", "replace")[:MAX_MESSAGE_CHARS]


__all__ = ["InBand", "going_on"]
