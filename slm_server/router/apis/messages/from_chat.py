"""A chat completion translated into a Messages API answer, and the parts the stream
translator shares with it (ids, stop reasons, usage, tool inputs). Pure."""

from __future__ import annotations

import json
import secrets
from typing import Any

from slm_server.errors import BackendProtocolError, anthropic_error_body
from slm_server.router.answer.chat_walk import reasoning_text
from slm_server.router.answer.translation import backend_message

# Chat finish reasons as Anthropic stop reasons. A stop sequence ends a chat completion
# with "stop" like the end of a turn, and chat completions do not say which: it is
# reported as end_turn, with stop_sequence null.
STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}


def new_id(prefix: str) -> str:
    """An id in Anthropic's style: ``msg_...``, ``toolu_...``."""
    return f"{prefix}_{secrets.token_hex(12)}"


def stop_reason(finish_reason: Any, called_tools: bool) -> str:
    """The Anthropic ``stop_reason`` for a chat ``finish_reason``: ``tool_use`` whenever
    the answer ends in tool calls."""
    if called_tools and finish_reason != "length":
        return "tool_use"
    found = STOP_REASONS.get(finish_reason) if isinstance(finish_reason, str) else None
    return found or "end_turn"


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def usage_of(usage: Any) -> dict[str, int]:
    """Chat ``usage`` as Anthropic's: ``input_tokens`` are those not read from the
    prompt cache, which ``cache_read_input_tokens`` counts."""
    if not isinstance(usage, dict):
        return {"input_tokens": 0, "output_tokens": 0}
    prompt = _count(usage.get("prompt_tokens"))
    details = usage.get("prompt_tokens_details")
    cached = _count(details.get("cached_tokens")) if isinstance(details, dict) else 0
    cached = min(cached, prompt)
    return {
        "input_tokens": prompt - cached,
        "output_tokens": _count(usage.get("completion_tokens")),
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    }


def tool_input(arguments: Any) -> dict[str, Any]:
    """A tool call's arguments as the ``input`` object of a ``tool_use`` block; arguments
    that are not a JSON object (a small model's broken JSON) are kept as text under
    ``_raw_arguments``, as a tool can only be given an object."""
    if isinstance(arguments, dict):
        return arguments
    if not isinstance(arguments, str) or not arguments.strip():
        return {}
    try:
        parsed = json.loads(arguments)
    except (ValueError, RecursionError):
        parsed = None
    return parsed if isinstance(parsed, dict) else {"_raw_arguments": arguments}


def thinking_block(text: str) -> dict[str, Any]:
    """A ``thinking`` block; the backend signs nothing, so its signature is empty."""
    return {"type": "thinking", "thinking": text, "signature": ""}


def text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def tool_use_block(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": arguments}


def model_of(request: dict[str, Any]) -> str:
    model = request.get("model")
    return model if isinstance(model, str) else ""


def chat_to_message(chat: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """The Messages API answer for a whole chat completion: a thinking block (from
    ``reasoning_content``), a text block, one ``tool_use`` block per tool call, the stop
    reason and the usage. ``model`` is the request's. Raises
    :class:`BackendProtocolError` when ``chat`` has no choice with a message."""
    choices = chat.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else None
    message = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(choice, dict) or not isinstance(message, dict):
        raise BackendProtocolError("the backend's chat completion has no choice with a message")
    content: list[dict[str, Any]] = []
    reasoning = reasoning_text(message)
    if reasoning:
        content.append(thinking_block(reasoning))
    text = message.get("content")
    if isinstance(text, str) and text:
        content.append(text_block(text))
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else []:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise BackendProtocolError("the backend returned a tool call without a function name")
        assert isinstance(call, dict)
        call_id = call.get("id")
        call_id = call_id if isinstance(call_id, str) and call_id else new_id("toolu")
        content.append(
            tool_use_block(call_id, function["name"], tool_input(function.get("arguments")))
        )
    called = any(block["type"] == "tool_use" for block in content)
    return {
        "id": new_id("msg"),
        "type": "message",
        "role": "assistant",
        "model": model_of(request),
        "content": content,
        "stop_reason": stop_reason(choice.get("finish_reason"), called),
        "stop_sequence": None,
        "usage": usage_of(chat.get("usage")),
    }


def backend_error(status: int, content: bytes) -> dict[str, Any]:
    """A backend's error answer (any shape) as Anthropic's error object, its message kept."""
    return anthropic_error_body(status, backend_message(status, content))


__all__ = [
    "backend_error",
    "chat_to_message",
    "new_id",
    "stop_reason",
    "tool_input",
    "usage_of",
]
