"""llama-server's streamed infill answer as OpenAI's completions stream. Pure.

llama-server streams ``/infill`` in its own shape, not OpenAI's: each event a
``data: {"content": ..., "stop": false, ...}`` object, the last one ``"stop": true``
with ``stop_type`` and the token counts, and no ``[DONE]``. Each piece of text becomes
a ``text_completion`` chunk, the last event a chunk with the finish reason, then (when
the client asked ``stream_options.include_usage``) a chunk with the usage and no
choices, then ``data: [DONE]``.
"""

from __future__ import annotations

import json
from typing import Any

from slm_server.router.apis.infill.from_infill import Head, choice, finish_reason, usage

DONE = b"data: [DONE]\n\n"


def event(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data, ensure_ascii=False).encode() + b"\n\n"


class InfillStreamTranslator:
    """One infill stream's events as completion chunks; ``include_usage``: the client
    asked for the usage chunk."""

    def __init__(self, head: Head, *, include_usage: bool) -> None:
        self.head = head
        self.include_usage = include_usage
        self.usage: dict[str, int] | None = None

    def chunk(self, text: str, reason: str | None) -> dict[str, Any]:
        """A completion chunk of this stream."""
        return {**self.head.fields(), "choices": [choice(text, reason)]}

    def feed(self, native: dict[str, Any]) -> list[dict[str, Any]]:
        """The chunks of one event of llama-server's (its progress reports left out
        before)."""
        chunks = []
        content = native.get("content")
        if isinstance(content, str) and content:
            chunks.append(self.chunk(content, None))
        if native.get("stop") is True:
            self.usage = usage(native)
            chunks.append(self.chunk("", finish_reason(native)))
        return chunks

    def finish(self) -> list[dict[str, Any]]:
        """The chunks after the last event: the usage, when asked and known."""
        if not self.include_usage or self.usage is None:
            return []
        return [{**self.head.fields(), "choices": [], "usage": self.usage}]


__all__ = ["DONE", "InfillStreamTranslator", "event"]
