"""Strict checks of Messages API answers against the anthropic package's own types: every
field of the right type with no coercion (pydantic strict mode), no field the type does
not know, and for a stream, the events in Anthropic's order."""

from __future__ import annotations

import json
from typing import Any

from anthropic.types import Message, MessageTokensCount, RawMessageStreamEvent
from anthropic.types.shared import ErrorResponse
from pydantic import BaseModel, TypeAdapter

EVENTS: TypeAdapter[RawMessageStreamEvent] = TypeAdapter(RawMessageStreamEvent)


def _no_unknown_fields(model: BaseModel, where: str) -> None:
    extra = model.model_extra or {}
    assert not extra, f"{where}: fields the anthropic types do not know: {sorted(extra)}"
    for name in type(model).model_fields:
        value = getattr(model, name)
        items = value if isinstance(value, list) else [value]
        for index, item in enumerate(items):
            if isinstance(item, BaseModel):
                _no_unknown_fields(item, f"{where}.{name}[{index}]")


def strict_message(raw: dict[str, Any]) -> Message:
    """``raw`` as a :class:`Message`, validated strictly."""
    message = Message.model_validate(raw, strict=True)
    _no_unknown_fields(message, "message")
    return message


def strict_count(raw: dict[str, Any]) -> MessageTokensCount:
    count = MessageTokensCount.model_validate(raw, strict=True)
    _no_unknown_fields(count, "count")
    return count


def strict_error(raw: object, kind: str | None = None) -> ErrorResponse:
    """``raw`` as Anthropic's error object, validated strictly; of type ``kind`` if given."""
    error = ErrorResponse.model_validate(raw, strict=True)
    _no_unknown_fields(error, "error")
    if kind is not None:
        assert error.error.type == kind, raw
    return error


def sse_events(body: bytes) -> list[tuple[str, dict[str, Any]]]:
    """The ``(event, data)`` pairs of an SSE body, checking each names its data's type."""
    found = []
    for frame in body.decode().split("\n\n"):
        if not frame.strip():
            continue
        lines = frame.split("\n")
        assert lines[0].startswith("event: ") and lines[1].startswith("data: "), frame
        name = lines[0][len("event: ") :]
        data = json.loads(lines[1][len("data: ") :])
        assert data["type"] == name, frame
        found.append((name, data))
    return found


def strict_events(raw: list[dict[str, Any]], *, ends: str = "message_stop") -> list[Any]:
    """A whole stream's events, each validated strictly (pings, which the SDK has no
    type for, are ``{"type": "ping"}`` exactly), in Anthropic's order: message_start,
    then content blocks each started, changed and stopped in index order one at a
    time, then message_delta and message_stop (or, ``ends="error"``, an error event
    last)."""
    raw = [data for data in raw if data != {"type": "ping"}]  # the SDK skips pings
    events: list[Any] = []
    for index, data in enumerate(raw):
        if data["type"] == "error":
            assert index == len(raw) - 1, "an error event ends the stream"
            events.append(strict_error(data))
            continue
        event = EVENTS.validate_python(data, strict=True)
        _no_unknown_fields(event, f"event {index} ({event.type})")
        events.append(event)
    kinds = [data["type"] for data in raw]
    assert kinds[0] == "message_start"
    assert kinds[-1] == ends, kinds
    open_block: int | None = None
    next_block = 0
    for data in raw[1:]:
        kind = data["type"]
        if kind == "content_block_start":
            assert open_block is None and data["index"] == next_block, kinds
            open_block = next_block
            next_block += 1
        elif kind == "content_block_delta":
            assert data["index"] == open_block, kinds
        elif kind == "content_block_stop":
            assert data["index"] == open_block, kinds
            open_block = None
        elif kind in ("message_delta", "message_stop"):
            assert open_block is None, kinds
    if ends == "message_stop":
        assert kinds[-2] == "message_delta", kinds
    return events
