"""Strict checks of Responses API answers (and chat completions) against the openai
package's own types: every field of the right type with no coercion (pydantic strict
mode), no field the type does not know, and for a Responses stream, events numbered 0,
1, 2... by ``sequence_number``."""

from __future__ import annotations

from typing import Any

from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import BaseModel, TypeAdapter

EVENTS: TypeAdapter[ResponseStreamEvent] = TypeAdapter(ResponseStreamEvent)


# What llama-server adds to a chat completion (and its last chunk), beside OpenAI's fields:
# its timings, at the top level. Chat completions are passed through, not rebuilt.
LLAMA_SERVER_EXTRAS = frozenset({"timings"})


def _no_unknown_fields(model: BaseModel, where: str, allowed: frozenset[str] = frozenset()) -> None:
    extra = set(model.model_extra or {}) - allowed
    assert not extra, f"{where}: fields the openai types do not know: {sorted(extra)}"
    for name in type(model).model_fields:
        value = getattr(model, name)
        items = value if isinstance(value, list) else [value]
        for index, item in enumerate(items):
            if isinstance(item, BaseModel):
                _no_unknown_fields(item, f"{where}.{name}[{index}]")


def strict_chat_completion(raw: dict[str, Any]) -> ChatCompletion:
    """``raw`` as a :class:`ChatCompletion`, validated strictly (llama-server's
    ``timings`` aside)."""
    completion = ChatCompletion.model_validate(raw, strict=True)
    _no_unknown_fields(completion, "completion", LLAMA_SERVER_EXTRAS)
    return completion


def strict_chat_chunks(raw: list[dict[str, Any]]) -> list[ChatCompletionChunk]:
    """A chat completions stream's chunks, each validated strictly (llama-server's
    ``timings`` aside), the last choice finished."""
    chunks = [ChatCompletionChunk.model_validate(chunk, strict=True) for chunk in raw]
    for index, chunk in enumerate(chunks):
        _no_unknown_fields(chunk, f"chunk {index}", LLAMA_SERVER_EXTRAS)
    finished = [c.finish_reason for chunk in chunks for c in chunk.choices if c.finish_reason]
    assert len(finished) == 1, finished
    return chunks


def strict_completion(raw: dict[str, Any]) -> Completion:
    """``raw`` as a legacy :class:`Completion` (``POST /v1/completions``), validated
    strictly."""
    completion = Completion.model_validate(raw, strict=True)
    _no_unknown_fields(completion, "completion")
    return completion


def strict_completion_chunks(raw: list[dict[str, Any]]) -> list[Completion]:
    """A completions stream's chunks, each a :class:`Completion` validated strictly (the
    openai package reads a stream's chunks as that type, whose ``finish_reason`` is not
    optional: it is null until the last choice, which is checked here and validated
    as ``stop``), exactly one choice finished, a usage chunk only after it."""
    chunks = []
    finished = []
    for index, chunk in enumerate(raw):
        choices = [
            {**c, "finish_reason": c["finish_reason"] or "stop"} for c in chunk.get("choices", [])
        ]
        finished += [c["finish_reason"] for c in chunk.get("choices", []) if c["finish_reason"]]
        completion = Completion.model_validate({**chunk, "choices": choices}, strict=True)
        _no_unknown_fields(completion, f"chunk {index}")
        if not choices:
            assert completion.usage is not None and finished, f"chunk {index}: usage first"
        chunks.append(completion)
    assert len(finished) == 1, finished
    return chunks


def strict_response(raw: dict[str, Any]) -> Response:
    """``raw`` as a :class:`Response`, validated strictly."""
    response = Response.model_validate(raw, strict=True)
    _no_unknown_fields(response, "response")
    return response


def strict_events(raw: list[dict[str, Any]]) -> list[ResponseStreamEvent]:
    """A whole stream's events, each validated strictly, numbered from 0 without gaps,
    the last one terminal."""
    events = [EVENTS.validate_python(event, strict=True) for event in raw]
    for index, event in enumerate(events):
        _no_unknown_fields(event, f"event {index} ({event.type})")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created"
    assert events[-1].type in ("response.completed", "response.incomplete", "response.failed")
    return events
