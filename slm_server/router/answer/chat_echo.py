"""A chat completions answer passed to the client in its own shape, chunk by chunk as
parsed: the :class:`~.translation.Translation` of a chat request whose answer the router
changes (its tool calls settled, :mod:`slm_server.router.toolcalls`). Every other chat
answer is relayed byte for byte."""

from __future__ import annotations

import json
from typing import Any

from slm_server.errors import GatewayError
from slm_server.router.answer.translation import ChatTranslation, error_message
from slm_server.router.upstream.client import backend_error_body

DONE = b"data: [DONE]\n\n"


class ChunkWriter:
    """Chat chunks written as the server-sent events they came as; the usage-only chunk
    the router asked for (``hidden_usage``) kept from the client."""

    def __init__(self, hidden_usage: bool) -> None:
        self.hidden_usage = hidden_usage

    def start(self) -> list[bytes]:
        return []

    def feed(self, chunk: dict[str, Any]) -> list[bytes]:
        if self.hidden_usage and not chunk.get("choices") and "usage" in chunk:
            return []
        return [_event(chunk)]

    def finish(self) -> list[bytes]:
        return [DONE]


class ChatEcho(ChatTranslation[ChunkWriter]):
    """Chat completions in, chat completions out."""

    api = "chat completions"

    def __init__(self, request: dict[str, Any], *, hidden_usage: bool) -> None:
        super().__init__(request, ChunkWriter(hidden_usage), capped=False)

    def answer(self, chat: dict[str, Any]) -> dict[str, Any]:
        return chat

    def failed(self, error: Any) -> list[bytes]:
        body = error if isinstance(error, dict) else {"message": error_message(error)}
        return [_event({"error": body})]

    def error_body(self, status: int, content: bytes) -> bytes:
        return backend_error_body(status, content)

    def stream_error(self, error: GatewayError) -> bytes:
        return error.sse_event()


def _event(chunk: dict[str, Any]) -> bytes:
    return (
        b"data: " + json.dumps(chunk, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"
    )


__all__ = ["ChatEcho", "ChunkWriter"]
