"""How an answer in chat completions' shape is turned into another API's: the
:class:`Translation` a handler gives :meth:`~slm_server.router.answer.reply.Replies.reply`,
and the Responses API's (:class:`ResponsesTranslation`). The Messages API's is
:class:`~slm_server.router.apis.messages.endpoint.MessagesTranslation`.

An answer cut by the model's preset cap (``max_output_tokens`` in the registry), when the
client's own bound was larger, is translated as a finished turn (:func:`cap_ends_turn`):
the client did not ask for the cut, and the agents that speak these APIs take a cut as
an error to retry with a larger bound (Claude Code asks again with ``max_tokens``
128000, then gives up) or as a failed run (Codex CLI on ``incomplete``), so that the same
cap would only end them again."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, Protocol

from slm_server.errors import GatewayError
from slm_server.router.apis.responses.translate import ResponseStreamTranslator, chat_to_response
from slm_server.router.observe.exchange import Exchange
from slm_server.router.upstream.client import backend_error_body


class Translation(Protocol):
    """One request's answer translated from chat completions."""

    api: str  # named in errors: "the Responses API"

    def whole(self, chat: dict[str, Any]) -> dict[str, Any]:
        """The answer for a whole chat completion."""
        ...

    def error_body(self, status: int, content: bytes) -> bytes:
        """The error answer for a backend's error (or unreadable) answer ``content``."""
        ...

    def stream(
        self, chunks: AsyncIterator[dict[str, Any]], exchange: Exchange
    ) -> AsyncIterator[bytes]:
        """The translated stream of the parsed chat chunks."""
        ...

    def stream_error(self, error: GatewayError) -> bytes:
        """The in-band end of a stream cut by ``error``."""
        ...


def cap_ends_turn(chat: dict[str, Any]) -> dict[str, Any]:
    """Chat answer or chunk ``chat`` with each choice's ``length`` finish made ``stop``
    (``chat`` itself when it has none): the answer was cut by the preset's cap, not the
    client's bound."""
    choices = chat.get("choices")
    if not isinstance(choices, list) or not any(
        isinstance(c, dict) and c.get("finish_reason") == "length" for c in choices
    ):
        return chat
    ended = [
        {**c, "finish_reason": "stop"}
        if isinstance(c, dict) and c.get("finish_reason") == "length"
        else c
        for c in choices
    ]
    return {**chat, "choices": ended}


class ResponsesTranslation:
    """The Responses API's answer to ``request``; ``capped``: the preset's cap, not the
    client's bound, limits the output (a cut there is a finished turn)."""

    api = "the Responses API"

    def __init__(self, request: dict[str, Any], *, capped: bool = False) -> None:
        self.request = request
        self.capped = capped
        self.translator = ResponseStreamTranslator(request)

    def whole(self, chat: dict[str, Any]) -> dict[str, Any]:
        return chat_to_response(cap_ends_turn(chat) if self.capped else chat, self.request)

    def error_body(self, status: int, content: bytes) -> bytes:
        return backend_error_body(status, content)

    def stream_error(self, error: GatewayError) -> bytes:
        return b"".join(self.translator.error(error.message))

    async def stream(
        self, chunks: AsyncIterator[dict[str, Any]], exchange: Exchange
    ) -> AsyncIterator[bytes]:
        """A chat-completions stream as Responses-API events."""
        translator = self.translator
        for event in translator.start():
            yield event
        async for chunk in chunks:
            exchange.note_response(chunk)
            error = chunk.get("error")
            if error is not None:
                message = error.get("message") if isinstance(error, dict) else str(error)
                exchange.error_type = "backend_stream_error"
                for event in translator.error(str(message)):
                    yield event
                return
            for event in translator.feed(cap_ends_turn(chunk) if self.capped else chunk):
                yield event
        for event in translator.finish():
            yield event


def error_message(error: Any) -> str:
    """The message of a stream's ``error`` chunk (an object or anything else)."""
    message = error.get("message") if isinstance(error, dict) else error
    return message if isinstance(message, str) else json.dumps(error)


__all__ = ["ResponsesTranslation", "Translation", "cap_ends_turn", "error_message"]
