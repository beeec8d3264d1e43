"""The Responses API's answer, built from a chat completion: the objects
``openai.types.responses.Response`` and its output items accept (:func:`build_response`,
:func:`message_item`, ...), and a whole chat completion turned into one
(:func:`chat_to_response`); the stream's events are :mod:`.events`'. Pure: no I/O, no
clock beyond ``time.time()``."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from slm_server.errors import BackendProtocolError
from slm_server.router.answer.chat_walk import reasoning_text
from slm_server.router.apis.responses.custom_input import custom_input
from slm_server.router.apis.responses.tools import echoed_tools, offer_of

INCOMPLETE_REASONS = {"length": "max_output_tokens", "content_filter": "content_filter"}


def new_id(prefix: str) -> str:
    """A fresh identifier in the OpenAI style, ``<prefix>_<32 hex digits>``."""
    return f"{prefix}_{uuid.uuid4().hex}"


def incomplete_reason(finish_reason: Any) -> str | None:
    """The Responses ``incomplete_details.reason`` for a chat finish reason, if any."""
    return INCOMPLETE_REASONS.get(finish_reason) if isinstance(finish_reason, str) else None


def convert_usage(usage: Any) -> dict[str, Any] | None:
    """Chat ``usage`` (prompt/completion tokens) as Responses ``usage``; None if absent."""
    if not isinstance(usage, dict):
        return None

    def count(value: Any) -> int:
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    def detail(section: str, key: str) -> int:
        details = usage.get(section)
        return count(details.get(key)) if isinstance(details, dict) else 0

    prompt = count(usage.get("prompt_tokens"))
    completion = count(usage.get("completion_tokens"))
    return {
        "input_tokens": prompt,
        "input_tokens_details": {
            "cached_tokens": detail("prompt_tokens_details", "cached_tokens"),
            "cache_write_tokens": 0,
        },
        "output_tokens": completion,
        "output_tokens_details": {
            "reasoning_tokens": detail("completion_tokens_details", "reasoning_tokens")
        },
        "total_tokens": count(usage.get("total_tokens")) or prompt + completion,
    }


def output_text_part(text: str) -> dict[str, Any]:
    """An ``output_text`` content part."""
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def reasoning_part(text: str) -> dict[str, Any]:
    """A ``reasoning_text`` content part."""
    return {"type": "reasoning_text", "text": text}


def message_item(item_id: str, content: list[dict[str, Any]], status: str) -> dict[str, Any]:
    """An assistant ``message`` output item."""
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": content,
    }


def reasoning_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    """A ``reasoning`` output item; ``text=None`` gives the empty item a stream opens with."""
    content = [] if text is None else [reasoning_part(text)]
    return {"type": "reasoning", "id": item_id, "summary": [], "content": content, "status": status}


def function_call_item(
    item_id: str,
    call_id: str,
    name: str,
    arguments: str,
    status: str,
    namespace: str | None = None,
) -> dict[str, Any]:
    """A ``function_call`` output item (with the ``namespace`` of a namespace's tool)."""
    item = {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }
    if namespace:
        item["namespace"] = namespace
    return item


def custom_tool_call_item(
    item_id: str, call_id: str, name: str, text: str, namespace: str | None = None
) -> dict[str, Any]:
    """A ``custom_tool_call`` output item (it has no status)."""
    item = {"type": "custom_tool_call", "id": item_id, "call_id": call_id, "name": name}
    item["input"] = text
    if namespace:
        item["namespace"] = namespace
    return item


def build_response(
    request: dict[str, Any],
    *,
    response_id: str,
    created_at: int,
    status: str,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None = None,
    model: str | None = None,
    incomplete: str | None = None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A Responses object with the request's settings echoed (its tools without the
    hosted ones left out); ``model`` defaults to the request's.

    ``incomplete`` is the ``incomplete_details.reason``; ``error`` the ``{code, message}``
    of a failed response.
    """
    state = response_state(
        request,
        response_id=response_id,
        created_at=created_at,
        status=status,
        output=output,
        usage=usage,
        model=model,
        incomplete=incomplete,
        error=error,
    )
    return {**state, **echoed_settings(request)}


def response_state(
    request: dict[str, Any],
    *,
    response_id: str,
    created_at: int,
    status: str,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None,
    model: str | None,
    incomplete: str | None,
    error: dict[str, Any] | None,
) -> dict[str, Any]:
    """The fields of a Responses object that change as it goes (see :func:`build_response`)."""
    requested_model = request.get("model")
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "completed_at": int(time.time()) if status == "completed" else None,
        "model": requested_model if isinstance(requested_model, str) else (model or ""),
        "output": output,
        "usage": usage,
        "error": error,
        "incomplete_details": {"reason": incomplete} if incomplete else None,
    }


def echoed_settings(request: dict[str, Any]) -> dict[str, Any]:
    """The request's settings a Responses object repeats (see :func:`build_response`):
    the same in every event of a stream. An agent's ``instructions`` and ``tools`` make
    them most of an answer's bytes."""
    parallel = request.get("parallel_tool_calls")
    return {
        "instructions": request.get("instructions"),
        "max_output_tokens": request.get("max_output_tokens"),
        "metadata": request.get("metadata") or {},
        "parallel_tool_calls": parallel if isinstance(parallel, bool) else True,
        "temperature": request.get("temperature"),
        "top_p": request.get("top_p"),
        "tool_choice": request.get("tool_choice") or "auto",
        "tools": echoed_tools(request.get("tools")),
        "text": request.get("text") or {"format": {"type": "text"}},
        "reasoning": None,
        "previous_response_id": None,
        "truncation": "disabled",
        "background": False,
        "user": request.get("user"),
    }


def chat_to_response(chat: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """Translate a non-streaming chat completion into a Responses object.

    The output holds, in order, a ``reasoning`` item (from ``reasoning_content``), a
    ``message`` item when the assistant produced text or a refusal, and one
    ``function_call`` item per tool call (a ``custom_tool_call`` item for a custom
    tool's, each with the namespace of a namespace's tool). A ``length`` finish reason yields status
    ``incomplete`` with reason ``max_output_tokens``. Request settings are echoed as the
    Responses API does. Raises :class:`BackendProtocolError` when ``chat`` has no choice
    with a message.
    """
    choices = chat.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else None
    message = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(choice, dict) or not isinstance(message, dict):
        raise BackendProtocolError("the backend's chat completion has no choice with a message")
    reason = incomplete_reason(choice.get("finish_reason"))
    status = "incomplete" if reason else "completed"
    output: list[dict[str, Any]] = []
    reasoning = reasoning_text(message)
    if reasoning:
        output.append(reasoning_item(new_id("rs"), reasoning, "completed"))
    parts: list[dict[str, Any]] = []
    text = _content_text(message.get("content"))
    if text:
        parts.append(output_text_part(text))
    if isinstance(message.get("refusal"), str) and message["refusal"]:
        parts.append({"type": "refusal", "refusal": message["refusal"]})
    if parts:
        output.append(message_item(new_id("msg"), parts, status))
    offer = offer_of(request)
    for call in message.get("tool_calls") or []:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise BackendProtocolError("the backend returned a tool call without a function name")
        arguments = function.get("arguments", "")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments)
        call_id = call.get("id") if isinstance(call.get("id"), str) else new_id("call")
        ref = offer.ref(function["name"])
        if ref.kind == "custom":
            text = custom_input(arguments)
            output.append(
                custom_tool_call_item(new_id("ctc"), call_id, ref.name, text, ref.namespace)
            )
        else:
            output.append(
                function_call_item(
                    new_id("fc"), call_id, ref.name, arguments, status, ref.namespace
                )
            )
    created = chat.get("created")
    return build_response(
        request,
        response_id=new_id("resp"),
        created_at=created if isinstance(created, int) else int(time.time()),
        status=status,
        output=output,
        usage=convert_usage(chat.get("usage")),
        model=chat.get("model") if isinstance(chat.get("model"), str) else None,
        incomplete=reason,
    )


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    return ""


__all__ = [
    "build_response",
    "chat_to_response",
    "convert_usage",
    "custom_tool_call_item",
    "echoed_settings",
    "function_call_item",
    "incomplete_reason",
    "message_item",
    "new_id",
    "output_text_part",
    "reasoning_item",
    "reasoning_part",
    "response_state",
]
