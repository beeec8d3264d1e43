"""llama-server's infill answer back in OpenAI's completions shape. Pure.

Its answer is llama-server's own (``to_json_non_oaicompat``): the middle as
``content``, ``stop_type`` (``eos``, ``word``, ``limit``, ``none``), the prompt's and
the answer's token counts as ``tokens_evaluated`` and ``tokens_predicted``, and its
settings and timings, which OpenAI's shape has no place for.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any

OBJECT = "text_completion"


def finish_reason(native: dict[str, Any]) -> str:
    """OpenAI's reason for an infill answer's end: ``length`` when it hit the bound."""
    return "length" if native.get("stop_type") == "limit" else "stop"


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def usage(native: dict[str, Any]) -> dict[str, int]:
    """OpenAI's usage from llama-server's token counts."""
    prompt = _count(native.get("tokens_evaluated"))
    completion = _count(native.get("tokens_predicted"))
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


@dataclass(frozen=True)
class Head:
    """What every object of one answer carries: its id, its creation time, the model."""

    model: str
    id: str = field(default_factory=lambda: f"cmpl-{secrets.token_hex(12)}")
    created: int = field(default_factory=lambda: int(time.time()))

    def fields(self) -> dict[str, Any]:
        return {"id": self.id, "object": OBJECT, "created": self.created, "model": self.model}


def choice(text: str, reason: str | None) -> dict[str, Any]:
    return {"text": text, "index": 0, "logprobs": None, "finish_reason": reason}


def infill_to_completion(native: dict[str, Any], head: Head) -> dict[str, Any]:
    """A whole infill answer as a completion."""
    content = native.get("content")
    text = content if isinstance(content, str) else ""
    return {
        **head.fields(),
        "choices": [choice(text, finish_reason(native))],
        "usage": usage(native),
    }


__all__ = ["OBJECT", "Head", "choice", "finish_reason", "infill_to_completion", "usage"]
