"""The Responses API's event stream, from a chat completions stream: the
:class:`ResponseStreamTranslator` turns chat chunks into the events the ``openai``
client parses, with the objects :mod:`.from_chat` builds. No I/O.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from slm_server.router.answer.chat_walk import CallPiece, walk_chunk, walk_delta
from slm_server.router.apis.responses.custom_input import InputReader
from slm_server.router.apis.responses.from_chat import (
    convert_usage,
    custom_tool_call_item,
    echoed_settings,
    function_call_item,
    incomplete_reason,
    message_item,
    new_id,
    output_text_part,
    reasoning_item,
    reasoning_part,
    response_state,
)
from slm_server.router.apis.responses.tools import offer_of


def _dumps(value: dict[str, Any]) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


@dataclass
class _Item:
    """One output item as it streams. A call's ``text`` is its arguments, or for a custom
    tool call the input decoded so far by its ``reader``."""

    kind: str
    item_id: str
    output_index: int = -1
    text: str = ""
    call_id: str = ""
    name: str = ""
    status: str = "in_progress"
    namespace: str | None = None
    reader: InputReader | None = None

    @property
    def has_content(self) -> bool:
        """Whether the item's text is a content part (messages and reasoning)."""
        return self.kind in ("message", "reasoning")

    def part(self, text: str) -> dict[str, Any]:
        return output_text_part(text) if self.kind == "message" else reasoning_part(text)

    def snapshot(self) -> dict[str, Any]:
        return self._item(self.text, self.status)

    def opening(self) -> dict[str, Any]:
        return self._item(None, "in_progress")

    def _item(self, text: str | None, status: str) -> dict[str, Any]:
        if self.kind == "message":
            return message_item(self.item_id, [] if text is None else [self.part(text)], status)
        if self.kind == "reasoning":
            return reasoning_item(self.item_id, text, status)
        if self.kind == "custom_tool_call":
            return custom_tool_call_item(
                self.item_id, self.call_id, self.name, text or "", self.namespace
            )
        return function_call_item(
            self.item_id, self.call_id, self.name, text or "", status, self.namespace
        )


class ResponseStreamTranslator:
    """Turns one chat completions stream into one Responses event stream.

    Call :meth:`start` once, :meth:`feed` per parsed ``chat.completion.chunk``, then
    :meth:`finish` at the end of the backend stream or :meth:`error` if it broke. Every
    method returns SSE events (``event: <type>\\ndata: <json>\\n\\n``) numbered by an
    increasing ``sequence_number``. Reasoning and text open one output item each while they
    flow and are closed when another item starts; each tool call (by chat ``index``) opens
    a ``function_call`` item (a ``custom_tool_call`` item for a custom tool, see
    :mod:`.tools`) once its name is known, and stays open until :meth:`finish`.
    After :meth:`finish` or :meth:`error` the translator is :attr:`closed` and every
    method returns no events; :meth:`feed` and the closing methods call :meth:`start`
    themselves if it was not called.
    """

    def __init__(self, request: dict[str, Any]) -> None:
        self._request = request
        # Serialised once: response.created, .in_progress and the last event repeat them.
        self._settings = _dumps(echoed_settings(request))
        self._offer = offer_of(request)
        self._response_id = new_id("resp")
        self._created_at = int(time.time())
        self._sequence = 0
        self._started = False
        self._closed = False
        self._items: list[_Item] = []
        self._current: _Item | None = None
        self._calls: dict[int, _Item] = {}
        self._usage: dict[str, Any] | None = None
        self._finish_reason: str | None = None
        self._model: str | None = None

    @property
    def closed(self) -> bool:
        """True once a terminal event (completed, incomplete or failed) was emitted."""
        return self._closed

    def start(self) -> list[bytes]:
        """``response.created`` and ``response.in_progress``; nothing if already started."""
        if self._started:
            return []
        self._started = True
        response = self._response("in_progress")
        return [
            self._response_event("response.created", response),
            self._response_event("response.in_progress", response),
        ]

    def feed(self, chunk: dict[str, Any]) -> list[bytes]:
        """The events for one chat chunk; a chunk carrying ``error`` ends the stream as failed."""
        if self._closed:
            return []
        events = self.start()
        if chunk.get("error"):
            return events + self.error(_error_message(chunk["error"]))
        if isinstance(chunk.get("model"), str):
            self._model = chunk["model"]
        self._usage = convert_usage(chunk.get("usage")) or self._usage
        told, finish = walk_chunk(chunk, self._delta)
        if finish is not None:
            self._finish_reason = finish
        return events + told

    def finish(self) -> list[bytes]:
        """Close every open item and emit ``response.completed`` (or ``response.incomplete``)."""
        if self._closed:
            return []
        events = self.start()
        reason = incomplete_reason(self._finish_reason)
        status = "incomplete" if reason else "completed"
        for index in sorted(self._calls):
            if self._calls[index].output_index < 0:
                events += self._open_call(self._calls[index])
        for item in self._items:
            if item.status == "in_progress":
                events += self._close(item, status)
        self._closed = True
        kind = "response.incomplete" if reason else "response.completed"
        return [*events, self._response_event(kind, self._response(status, reason))]

    def error(self, message: str) -> list[bytes]:
        """End the stream with ``response.failed`` carrying ``message``.

        Items still open are reported with status ``incomplete``.
        """
        if self._closed:
            return []
        events = self.start()
        for item in self._items:
            if item.status == "in_progress":
                item.status = "incomplete"
        self._closed = True
        failure = {"code": "server_error", "message": message}
        response = self._response("failed", None, failure)
        return [*events, self._response_event("response.failed", response)]

    def _delta(self, delta: dict[str, Any]) -> list[bytes]:
        return walk_delta(
            delta,
            reasoning=lambda text: self._stream_text("reasoning", text),
            content=lambda text: self._stream_text("message", text),
            tool_call=self._stream_call,
        )

    def _stream_text(self, kind: str, text: str) -> list[bytes]:
        events: list[bytes] = []
        item = self._current
        if item is None or item.kind != kind:
            events += self._close_current()
            item = _Item(kind, new_id("msg" if kind == "message" else "rs"))
            events += self._open(item)
            self._current = item
        item.text += text
        if kind == "message":
            events.append(self._on("response.output_text.delta", item, delta=text, logprobs=[]))
        else:
            events.append(self._on("response.reasoning_text.delta", item, delta=text))
        return events

    def _stream_call(self, piece: CallPiece) -> list[bytes]:
        index = piece.index if piece.index is not None else len(self._calls)
        item = self._calls.setdefault(
            index, _Item("function_call", new_id("fc"), call_id=new_id("call"))
        )
        arguments = piece.arguments or ""
        if item.output_index >= 0:
            return self._call_delta(item, arguments)
        if piece.call_id is not None:
            item.call_id = piece.call_id
        if piece.name is not None and not item.name:
            item.name = piece.name
        item.text += arguments
        return self._open_call(item) if item.name else []

    def _open_call(self, item: _Item) -> list[bytes]:
        """Open a call's item as the tool its chat function name stands for, with the
        arguments that came before the name."""
        ref = self._offer.ref(item.name)
        item.name, item.namespace = ref.name, ref.namespace
        if ref.kind == "custom":
            item.kind, item.item_id, item.reader = "custom_tool_call", new_id("ctc"), InputReader()
        early, item.text = item.text, ""
        return [*self._close_current(), *self._open(item), *self._call_delta(item, early)]

    def _call_delta(self, item: _Item, arguments: str) -> list[bytes]:
        if item.reader is None:
            item.text += arguments
            if not arguments:
                return []
            return [self._on("response.function_call_arguments.delta", item, delta=arguments)]
        text = item.reader.feed(arguments)
        item.text = item.reader.sent
        return [self._on("response.custom_tool_call_input.delta", item, delta=text)] if text else []

    def _open(self, item: _Item) -> list[bytes]:
        item.output_index = len(self._items)
        self._items.append(item)
        events = [self._item_event("response.output_item.added", item, item.opening())]
        if item.has_content:
            events.append(self._on("response.content_part.added", item, part=item.part("")))
        return events

    def _close_current(self) -> list[bytes]:
        item, self._current = self._current, None
        return self._close(item, "completed") if item is not None else []

    def _close(self, item: _Item, status: str) -> list[bytes]:
        item.status = status
        if item.reader is not None:
            rest, item.text = item.reader.finish()
            delta = "response.custom_tool_call_input.delta"
            events = [self._on(delta, item, delta=rest)] if rest else []
            events.append(self._on("response.custom_tool_call_input.done", item, input=item.text))
        elif item.kind == "function_call":
            done = "response.function_call_arguments.done"
            events = [self._on(done, item, arguments=item.text, name=item.name)]
        elif item.kind == "message":
            events = [self._on("response.output_text.done", item, text=item.text, logprobs=[])]
        else:
            events = [self._on("response.reasoning_text.done", item, text=item.text)]
        if item.has_content:
            events.append(self._on("response.content_part.done", item, part=item.part(item.text)))
        events.append(self._item_event("response.output_item.done", item, item.snapshot()))
        return events

    def _item_event(self, kind: str, item: _Item, body: dict[str, Any]) -> bytes:
        return self._event(kind, output_index=item.output_index, item=body)

    def _on(self, kind: str, item: _Item, **fields: Any) -> bytes:
        where: dict[str, Any] = {"item_id": item.item_id, "output_index": item.output_index}
        if item.has_content:
            where["content_index"] = 0
        return self._event(kind, **where, **fields)

    def _response(
        self, status: str, incomplete: str | None = None, error: dict[str, Any] | None = None
    ) -> str:
        """The Responses object as JSON: its changing state serialised now, the echoed
        settings spliced in as serialised once."""
        state = response_state(
            self._request,
            response_id=self._response_id,
            created_at=self._created_at,
            status=status,
            output=[item.snapshot() for item in self._items],
            usage=None if status == "in_progress" else self._usage,
            model=self._model,
            incomplete=incomplete,
            error=error,
        )
        return _dumps(state)[:-1] + "," + self._settings[1:]

    def _response_event(self, kind: str, response: str) -> bytes:
        head = _dumps({"type": kind, "sequence_number": self._sequence})
        self._sequence += 1
        return self._frame(kind, head[:-1] + ',"response":' + response + "}")

    def _event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return self._frame(kind, _dumps(payload))

    @staticmethod
    def _frame(kind: str, data: str) -> bytes:
        return b"event: " + kind.encode() + b"\ndata: " + data.encode() + b"\n\n"


def _error_message(error: Any) -> str:
    message = error.get("message") if isinstance(error, dict) else error
    return message if isinstance(message, str) else json.dumps(error)
