"""The one walk over a chat completions stream, for every API shape the router
translates it into (the Responses API, the Messages API). Pure.

:func:`walk_chunk` reads a chunk's first choice: its delta, then its finish reason.
A delta is told in one order: its reasoning text, then its content, then each of its
tool calls (read as a :class:`CallPiece`). :func:`walk_delta` reads them in that order
and hands each to the translator's own handler, which makes that shape's events of it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Events = list[bytes]


def reasoning_text(message: dict[str, Any]) -> str:
    """The reasoning a chat message or delta carries (``reasoning_content`` or
    ``reasoning``)."""
    for key in ("reasoning_content", "reasoning"):
        value = message.get(key)
        if isinstance(value, str) and value:
            return value
    return ""


@dataclass(frozen=True, slots=True)
class CallPiece:
    """One piece of a streamed tool call: the call's position among the message's calls
    (None when the backend gave none), and what the piece says of its id and function
    name (None unless a non-empty string) and of its arguments (None unless a string)."""

    index: int | None
    call_id: str | None
    name: str | None
    arguments: str | None

    @classmethod
    def of(cls, piece: dict[str, Any]) -> CallPiece:
        index, call_id = piece.get("index"), piece.get("id")
        function = piece.get("function")
        function = function if isinstance(function, dict) else {}
        name, arguments = function.get("name"), function.get("arguments")
        return cls(
            index if isinstance(index, int) else None,
            call_id if isinstance(call_id, str) and call_id else None,
            name if isinstance(name, str) and name else None,
            arguments if isinstance(arguments, str) else None,
        )


def walk_chunk(
    chunk: dict[str, Any], delta: Callable[[dict[str, Any]], Events]
) -> tuple[Events, str | None]:
    """The events of one chat chunk (``delta`` of the delta of its first choice, index
    0), and the finish reason that choice gives (None when it gives none)."""
    events: Events = []
    finish: str | None = None
    choices = chunk.get("choices")
    for choice in choices if isinstance(choices, list) else []:
        if not isinstance(choice, dict) or choice.get("index", 0) != 0:
            continue
        told = choice.get("delta")
        if isinstance(told, dict):
            events += delta(told)
        if isinstance(choice.get("finish_reason"), str):
            finish = choice["finish_reason"]
    return events, finish


def walk_delta(
    delta: dict[str, Any],
    *,
    reasoning: Callable[[str], Events],
    content: Callable[[str], Events],
    tool_call: Callable[[CallPiece], Events],
) -> Events:
    """The events of one stream delta: ``reasoning`` of its reasoning text, ``content``
    of its text, ``tool_call`` of each tool call piece, in that order; empty parts and
    pieces that are not objects are skipped."""
    events: Events = []
    thought = reasoning_text(delta)
    if thought:
        events += reasoning(thought)
    text = delta.get("content")
    if isinstance(text, str) and text:
        events += content(text)
    calls = delta.get("tool_calls")
    for call in calls if isinstance(calls, list) else []:
        if isinstance(call, dict):
            events += tool_call(CallPiece.of(call))
    return events


__all__ = ["CallPiece", "reasoning_text", "walk_chunk", "walk_delta"]
