"""How an answer in chat completions' shape is turned into another API's: the
:class:`Translation` a handler gives :meth:`~slm_server.router.answer.reply.Replies.reply`,
and the Responses API's (:class:`ResponsesTranslation`). The Messages API's is
:class:`~slm_server.router.apis.messages.endpoint.MessagesTranslation`."""

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


class ResponsesTranslation:
    """The Responses API's answer to ``request``."""

    api = "the Responses API"

    def __init__(self, request: dict[str, Any]) -> None:
        self.request = request
        self.translator = ResponseStreamTranslator(request)

    def whole(self, chat: dict[str, Any]) -> dict[str, Any]:
        return chat_to_response(chat, self.request)

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
            for event in translator.feed(chunk):
                yield event
        for event in translator.finish():
            yield event


def error_message(error: Any) -> str:
    """The message of a stream's ``error`` chunk (an object or anything else)."""
    message = error.get("message") if isinstance(error, dict) else error
    return message if isinstance(message, str) else json.dumps(error)


__all__ = ["ResponsesTranslation", "Translation", "error_message"]
