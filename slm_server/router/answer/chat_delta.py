"""What a chat completions message or stream delta carries, read once for every API
shape the router translates it into (the Responses API, the Messages API). Pure.

A delta is told in one order: its reasoning text, then its content, then each of its
tool calls. :func:`walk_delta` reads them in that order and hands each to the
translator's own handler, which makes that shape's events of it.
"""

from __future__ import annotations

from collections.abc import Callable
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


def walk_delta(
    delta: dict[str, Any],
    *,
    reasoning: Callable[[str], Events],
    content: Callable[[str], Events],
    tool_call: Callable[[dict[str, Any]], Events],
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
            events += tool_call(call)
    return events


__all__ = ["reasoning_text", "walk_delta"]
