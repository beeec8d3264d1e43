"""A whole chat completion gathered from a stream: a request that did not ask to stream,
sent to an engine that reports its prompt progress (native llama-server) as a stream so
that the watchdog judges it as it judges every stream — each progress report and token
a sign of life, silence timed throughout — and answered with what the engine would
have answered whole: the same fields, the same values.

:class:`ChatGathering` rebuilds llama-server's whole answer from its chunks, following
how the pinned release writes both (``to_json_oaicompat_chat`` and
``to_json_oaicompat_chat_stream`` in ``tools/server/server-task.cpp``, the message as
``common_chat_msg::to_json_oaicompat`` writes it), read by the one walk over chat
chunks (:mod:`.chat_walk`): the deltas' ``content`` and
``reasoning_content`` joined (content ``""`` when there is none, reasoning only when
there is some), each tool call's pieces joined in its index's place (``type``
``function``, its ``id`` when it had one), the finish reason of the last choice, the
usage chunk's ``usage`` and the last chunk's ``timings``, and the chunks' ``id``,
``created``, ``model`` and ``system_fingerprint``; object ``chat.completion``.
``tests/integration/test_progress_real.py`` compares it with the real llama-server's
whole answer.
"""

from __future__ import annotations

from typing import Any, Final

from slm_server.errors import AnswerTooLarge
from slm_server.router.answer.chat_walk import CallPiece, Events, walk_chunk, walk_delta
from slm_server.router.upstream.sse import PROGRESS_FIELD

# The chunk's fields the whole answer takes as they are.
_SAME: Final = ("created", "model", "system_fingerprint", "id")


class ChatGathering:
    """The chunks of one chat completion stream, fed as they come (``feed``); the
    whole answer (``answer()``). Bounded: more than ``max_bytes`` of text raises
    :class:`AnswerTooLarge`, as a whole answer that large would."""

    __slots__ = (
        "_calls",
        "_content",
        "_reasoning",
        "_size",
        "error",
        "finish_reason",
        "last",
        "max_bytes",
        "timings",
        "usage",
    )

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._calls: dict[int, dict[str, Any]] = {}
        self._size = 0
        self.finish_reason: Any = None
        self.last: dict[str, Any] | None = None
        self.usage: Any = None
        self.timings: Any = None
        self.error: dict[str, Any] | None = None

    def feed(self, chunk: dict[str, Any]) -> None:
        if PROGRESS_FIELD in chunk:  # the engine's prompt progress: the router's alone
            return
        error = chunk.get("error")
        if error is not None:
            self.error = chunk
            return
        self.last = chunk
        if "usage" in chunk:
            self.usage = chunk["usage"]
        if "timings" in chunk:
            self.timings = chunk["timings"]
        _, finish = walk_chunk(chunk, self._delta)
        if finish is not None:
            self.finish_reason = finish

    def _delta(self, delta: dict[str, Any]) -> Events:
        return walk_delta(
            delta, reasoning=self._reasoned, content=self._said, tool_call=self._called
        )

    def _reasoned(self, text: str) -> Events:
        self._add(self._reasoning, text)
        return []

    def _said(self, text: str) -> Events:
        self._add(self._content, text)
        return []

    def _called(self, piece: CallPiece) -> Events:
        index = piece.index if piece.index is not None else len(self._calls)
        call = self._calls.setdefault(index, {"id": "", "name": [], "arguments": []})
        if piece.call_id is not None:
            call["id"] = piece.call_id
        if piece.name is not None:
            self._add(call["name"], piece.name)
        if piece.arguments is not None:
            self._add(call["arguments"], piece.arguments)
        return []

    def _add(self, parts: list[str], text: str) -> None:
        self._size += len(text) if text.isascii() else len(text.encode())
        if self._size > self.max_bytes:
            raise AnswerTooLarge(
                f"The backend's answer passed the router's limit of {self.max_bytes} bytes",
                code="upstream_too_large",
            )
        parts.append(text)

    def answer(self) -> dict[str, Any]:
        """The whole chat completion, as the engine would have answered it."""
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self._content)}
        reasoning = "".join(self._reasoning)
        if reasoning:
            message["reasoning_content"] = reasoning
        if self._calls:
            calls = []
            for index in sorted(self._calls):
                call = self._calls[index]
                function = {"name": "".join(call["name"]), "arguments": "".join(call["arguments"])}
                made: dict[str, Any] = {"type": "function", "function": function}
                if call["id"]:
                    made["id"] = call["id"]
                calls.append(made)
            message["tool_calls"] = calls
        choice = {"finish_reason": self.finish_reason, "index": 0, "message": message}
        last = self.last or {}
        whole: dict[str, Any] = {"choices": [choice]}
        for name in _SAME:
            if name in last:
                whole[name] = last[name]
        whole["object"] = "chat.completion"
        if self.usage is not None:
            whole["usage"] = self.usage
        if self.timings is not None:
            whole["timings"] = self.timings
        return whole


__all__ = ["ChatGathering"]
