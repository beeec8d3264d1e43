"""``count_tokens`` without a backend that counts: an estimate from the translated chat
request. Pure.

A backend whose tokenizer the router cannot ask (MLX, the Python fallback, a remote
engine without the route) is not asked at all: the count is the characters of
everything the model would read (the messages' text, tool calls, tool names,
descriptions and schemas) divided by :data:`CHARS_PER_TOKEN`, plus
:data:`TOKENS_PER_MESSAGE` for each message's framing in the chat template. Good to
within tens of percent for English and code; an agent that uses the count to decide
when to compact its context needs no more.
"""

from __future__ import annotations

import json
import math
from typing import Any

CHARS_PER_TOKEN = 4
TOKENS_PER_MESSAGE = 4


def estimate_tokens(chat: dict[str, Any]) -> int:
    """About how many tokens the prompt of chat request ``chat`` is."""
    chars = 0
    messages = chat.get("messages")
    messages = messages if isinstance(messages, list) else []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            chars += len(content)
        elif isinstance(content, list):
            for part in content:
                text = part.get("text") if isinstance(part, dict) else None
                chars += len(text) if isinstance(text, str) else 0
        for call in message.get("tool_calls") or []:
            function = call.get("function", {})
            chars += len(function.get("name", "")) + len(function.get("arguments", ""))
    for tool in chat.get("tools") or []:
        chars += len(json.dumps(tool.get("function", {}), ensure_ascii=False))
    return math.ceil(chars / CHARS_PER_TOKEN) + TOKENS_PER_MESSAGE * len(messages)


__all__ = ["CHARS_PER_TOKEN", "TOKENS_PER_MESSAGE", "estimate_tokens"]
