"""A chat completions stream translated into the Messages API's event stream. Pure.

:class:`MessageStreamTranslator` turns chat chunks into Anthropic's events, in their
order: ``message_start``, a ``ping``, then per content block ``content_block_start``,
its deltas (``thinking_delta``, ``text_delta``, ``input_json_delta``) and
``content_block_stop``, one block open at a time, and at the end ``message_delta``
(stop reason and usage) and ``message_stop``. A stream that breaks ends with the
in-band ``error`` event instead.

A tool call's arguments are sent in one ``input_json_delta`` when its block closes,
as the JSON object :func:`~.answer.tool_input` makes of them: a small model's broken
JSON, streamed as it came, would make the client's accumulator fail.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from slm_server.router.answer.chat_walk import CallPiece, walk_chunk, walk_delta
from slm_server.router.apis.messages.from_chat import (
    model_of,
    new_id,
    stop_reason,
    text_block,
    thinking_block,
    tool_input,
    tool_use_block,
    usage_of,
)


@dataclass
class _Call:
    call_id: str
    name: str = ""
    arguments: str = ""
    index: int = -1  # the content block's, once opened
    done: bool = False


class MessageStreamTranslator:
    """Turns one chat completions stream into one Messages event stream.

    :meth:`start` once, :meth:`feed` per parsed chat chunk, then :meth:`finish` at the
    end of the backend's stream or :meth:`error` when it broke. Each returns SSE events
    (``event: <type>\\ndata: <json>\\n\\n``). After :meth:`finish` or :meth:`error` the
    translator is :attr:`closed` and returns nothing more; :meth:`feed` and the closing
    methods call :meth:`start` themselves when it was not called.
    """

    def __init__(self, request: dict[str, Any]) -> None:
        self._request = request
        self._id = new_id("msg")
        self._started = False
        self._closed = False
        self._blocks = 0  # content blocks opened so far
        self._open: str | None = None  # the kind of the block open now
        self._calls: dict[int, _Call] = {}
        self._current_call: _Call | None = None
        self._finish_reason: Any = None
        self._usage: Any = None

    @property
    def closed(self) -> bool:
        return self._closed

    def start(self) -> list[bytes]:
        """``message_start`` and a ``ping``; nothing if already started."""
        if self._started:
            return []
        self._started = True
        message: dict[str, Any] = {
            "id": self._id,
            "type": "message",
            "role": "assistant",
            "model": model_of(self._request),
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        return [_event("message_start", message=message), _event("ping")]

    def feed(self, chunk: dict[str, Any]) -> list[bytes]:
        """The events for one chat chunk."""
        if self._closed:
            return []
        events = self.start()
        if chunk.get("usage") is not None:
            self._usage = chunk["usage"]
        told, finish = walk_chunk(chunk, self._delta)
        if finish is not None:
            self._finish_reason = finish
        return events + told

    def finish(self) -> list[bytes]:
        """Close the open block (and any tool call not yet shown), then
        ``message_delta`` and ``message_stop``."""
        if self._closed:
            return []
        events = self.start() + self._close()
        for index in sorted(self._calls):
            call = self._calls[index]
            if not call.done:
                call.name = call.name or "unnamed"
                events += self._open_call(call) + self._close()
        self._closed = True
        called = bool(self._calls)
        usage = usage_of(self._usage)
        delta = {"stop_reason": stop_reason(self._finish_reason, called), "stop_sequence": None}
        return [
            *events,
            _event("message_delta", delta=delta, usage=usage),
            _event("message_stop"),
        ]

    def error(self, error_body: dict[str, Any]) -> list[bytes]:
        """The in-band ``error`` event carrying ``error_body`` (Anthropic's error object)."""
        if self._closed:
            return []
        events = self.start()
        self._closed = True
        return [*events, _sse("error", error_body)]

    def _delta(self, delta: dict[str, Any]) -> list[bytes]:
        return walk_delta(
            delta,
            reasoning=lambda text: self._text("thinking", text),
            content=lambda text: self._text("text", text),
            tool_call=self._call,
        )

    def _text(self, kind: str, text: str) -> list[bytes]:
        events: list[bytes] = []
        if self._open != kind:
            events += self._close()
            block = thinking_block("") if kind == "thinking" else text_block("")
            events.append(self._start_block(kind, block))
        if kind == "thinking":
            delta = {"type": "thinking_delta", "thinking": text}
        else:
            delta = {"type": "text_delta", "text": text}
        events.append(_event("content_block_delta", index=self._blocks - 1, delta=delta))
        return events

    def _call(self, piece: CallPiece) -> list[bytes]:
        position = piece.index if piece.index is not None else len(self._calls)
        call = self._calls.get(position)
        if call is None:
            call = self._calls[position] = _Call(new_id("toolu"))
        if not call.name and piece.call_id is not None:
            call.call_id = piece.call_id
        if piece.arguments is not None:
            call.arguments += piece.arguments
        if call.index < 0 and piece.name is not None:
            call.name = piece.name
            return self._open_call(call)
        return []

    def _open_call(self, call: _Call) -> list[bytes]:
        events = self._close()
        self._current_call = call
        call.index = self._blocks
        events.append(self._start_block("tool_use", tool_use_block(call.call_id, call.name, {})))
        return events

    def _start_block(self, kind: str, block: dict[str, Any]) -> bytes:
        self._open = kind
        self._blocks += 1
        return _event("content_block_start", index=self._blocks - 1, content_block=block)

    def _close(self) -> list[bytes]:
        """Close the block open now, if any (a tool call's arguments go out first)."""
        if self._open is None:
            return []
        events: list[bytes] = []
        index = self._blocks - 1
        call = self._current_call
        if self._open == "tool_use" and call is not None:
            arguments = json.dumps(tool_input(call.arguments), ensure_ascii=False)
            delta = {"type": "input_json_delta", "partial_json": arguments}
            events.append(_event("content_block_delta", index=index, delta=delta))
            call.done = True
            self._current_call = None
        self._open = None
        events.append(_event("content_block_stop", index=index))
        return events


def _event(kind: str, **fields: Any) -> bytes:
    return _sse(kind, {"type": kind, **fields})


def _sse(kind: str, payload: dict[str, Any]) -> bytes:
    data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return b"event: " + kind.encode() + b"\ndata: " + data.encode() + b"\n\n"


__all__ = ["MessageStreamTranslator"]
