"""A Responses request as a chat completions request, for backends without their own
``/v1/responses``: :func:`responses_to_chat` (and :func:`translate_request`, which also
says which hosted tools were left out). The answer comes back through
:mod:`.from_chat` (whole) and :mod:`.events` (streamed). Pure.

Tools are offered and their calls mapped back by :mod:`.tools`: namespaces' tools and
custom tools as chat functions, hosted tools left out (:attr:`ChatRequest.dropped`).
Requests that cannot be expressed as chat completions (stored state, the client-run
built-in tools, file references, unknown item types) raise :class:`InvalidRequest`
naming the field; malformed backend answers raise :class:`BackendProtocolError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from slm_server.errors import InvalidRequest
from slm_server.router.apis.responses.custom_input import custom_arguments
from slm_server.router.apis.responses.tools import (
    chat_name,
    chat_tool_choice,
    offer_tools,
)
from slm_server.router.intake.tool_calls import check_arguments

__all__ = [
    "ChatRequest",
    "needs_translation",
    "responses_to_chat",
    "translate_request",
]

ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
COPIED_FIELDS = ("model", "temperature", "top_p", "stream", "user", "parallel_tool_calls")
STATEFUL_FIELDS = ("previous_response_id", "conversation", "prompt")
RESPONSES_FIELDS = frozenset(
    {
        *COPIED_FIELDS,
        *STATEFUL_FIELDS,
        "input",
        "instructions",
        "max_output_tokens",
        "tools",
        "tool_choice",
        "text",
        "reasoning",
        "metadata",
        "store",
        "include",
        "truncation",
        "service_tier",
        "background",
        "stream_options",
        "prompt_cache_key",
        "prompt_cache_retention",
        "prompt_cache_options",
        "safety_identifier",
        "top_logprobs",
        "max_tool_calls",
        "context_management",
        "client_metadata",
    }
)
TEXT_PARTS = frozenset({"input_text", "output_text"})
# Input items that record what a model or a hosted tool did and that a chat model
# cannot be shown: reasoning (its encrypted content is OpenAI's), and hosted tools' calls
# (their tools are left out). They are dropped.
DROPPED_ITEMS: Final = frozenset(
    {
        "reasoning",
        "web_search_call",
        "file_search_call",
        "image_generation_call",
        "code_interpreter_call",
        "mcp_list_tools",
        "mcp_call",
        "mcp_approval_request",
        "mcp_approval_response",
        "tool_search_call",
        "tool_search_output",
    }
)
CALL_ITEMS: Final = frozenset({"custom_tool_call", "custom_tool_call_output"})


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """A Responses request as chat completions: the ``chat`` body, and the types of
    the hosted tools left out of it (``dropped``, each once, in order)."""

    chat: dict[str, Any]
    dropped: tuple[str, ...] = ()


def responses_to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The chat completions body for a Responses request (see :func:`translate_request`)."""
    return translate_request(body).chat


def needs_translation(body: dict[str, Any]) -> bool:
    """Whether the request uses what only the router's translation serves (tools other
    than functions, custom tool calls in ``input``), so that a backend's own
    ``/v1/responses`` is not asked."""
    tools, items = body.get("tools"), body.get("input")
    if isinstance(tools, list) and any(
        not isinstance(t, dict) or t.get("type") != "function" for t in tools
    ):
        return True
    return isinstance(items, list) and any(
        isinstance(i, dict) and (i.get("type") in CALL_ITEMS or i.get("namespace")) for i in items
    )


def translate_request(body: dict[str, Any]) -> ChatRequest:
    """Translate a Responses request body into a chat completions request body.

    ``instructions`` becomes a leading system message, ``input`` the following messages
    (``developer`` maps to ``system``; reasoning items and hosted tools' calls are
    dropped), ``max_output_tokens`` becomes ``max_tokens``, tools and ``tool_choice``
    are offered as chat functions (:mod:`.tools`) and ``text.format`` becomes
    ``response_format``. ``metadata``, ``reasoning``, ``include``, ``store``,
    ``prompt_cache_key``, ``client_metadata`` and the other Responses-only fields are
    dropped; fields the Responses API does not define (``top_k``, ``seed``,
    ``chat_template_kwargs``...) are forwarded unchanged. A streaming request asks for a
    final usage chunk. Raises :class:`InvalidRequest` with ``param`` naming the offending
    field for anything that has no chat completions equivalent.
    """
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    for field in STATEFUL_FIELDS:
        if body.get(field) is not None:
            raise InvalidRequest(
                f"`{field}` is not supported: this gateway keeps no stored responses, "
                "conversations or prompts; send the whole conversation in `input`",
                param=field,
            )
    if body.get("background"):
        raise InvalidRequest("background responses are not supported", param="background")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("`model` must be a non-empty string", param="model")

    chat: dict[str, Any] = {k: v for k, v in body.items() if k not in RESPONSES_FIELDS}
    chat.update({k: body[k] for k in COPIED_FIELDS if body.get(k) is not None})
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise InvalidRequest("`instructions` must be a string", param="instructions")
        messages.append({"role": "system", "content": instructions})
    messages.extend(_input_messages(body.get("input")))
    chat["messages"] = messages

    max_output_tokens = body.get("max_output_tokens")
    if max_output_tokens is not None:
        if isinstance(max_output_tokens, bool) or not isinstance(max_output_tokens, int):
            raise InvalidRequest(
                "`max_output_tokens` must be an integer", param="max_output_tokens"
            )
        chat["max_tokens"] = max_output_tokens
    offer = offer_tools(body.get("tools"))
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = chat_tool_choice(body["tool_choice"], offer)
    if offer.chat_tools:
        chat["tools"] = offer.chat_tools
    response_format = _response_format(body.get("text"))
    if response_format is not None:
        chat["response_format"] = response_format
    if chat.get("stream") is True:
        chat["stream_options"] = {"include_usage": True}
    return ChatRequest(chat, tuple(offer.dropped))


def _input_messages(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise InvalidRequest("`input` must be a string or a list of input items", param="input")
    if not value:
        raise InvalidRequest("`input` must not be empty", param="input")
    messages: list[dict[str, Any]] = []
    for index, item in enumerate(value):
        path = f"input[{index}]"
        if not isinstance(item, dict):
            raise InvalidRequest(f"`{path}` must be an object", param=path)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            messages.append(_chat_message(item, path))
        elif kind in ("function_call", "custom_tool_call"):
            _append_tool_call(messages, item, path)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            messages.append(_tool_message(item, path))
        elif kind not in DROPPED_ITEMS:
            raise InvalidRequest(
                f"input item type {kind!r} is not supported; expected message, "
                "function_call, function_call_output, custom_tool_call, "
                "custom_tool_call_output, reasoning or a hosted tool's call (dropped)",
                param=f"{path}.type",
            )
    return messages


def _chat_message(item: dict[str, Any], path: str) -> dict[str, Any]:
    role_name = item.get("role")
    role = ROLES.get(role_name) if isinstance(role_name, str) else None
    if role is None:
        raise InvalidRequest(
            f"`{path}.role` must be one of user, assistant, system, developer",
            param=f"{path}.role",
        )
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        raise InvalidRequest(
            f"`{path}.content` must be a string or a list of content parts",
            param=f"{path}.content",
        )
    parts = [_chat_part(part, f"{path}.content[{i}]", role) for i, part in enumerate(content)]
    if all(part["type"] == "text" for part in parts):
        return {"role": role, "content": "\n".join(part["text"] for part in parts)}
    return {"role": role, "content": parts}


def _chat_part(part: Any, path: str, role: str) -> dict[str, Any]:
    if not isinstance(part, dict):
        raise InvalidRequest(f"`{path}` must be an object", param=path)
    kind = part.get("type")
    if kind in TEXT_PARTS or kind == "refusal":
        text = part.get("refusal" if kind == "refusal" else "text")
        if not isinstance(text, str):
            raise InvalidRequest(f"`{path}` has no text", param=path)
        return {"type": "text", "text": text}
    if kind == "input_image":
        url = part.get("image_url")
        if role != "user":
            raise InvalidRequest("images are only supported in user messages", param=path)
        if not isinstance(url, str) or not url:
            raise InvalidRequest(
                f"`{path}` needs an `image_url` (a URL or data URL); file_id is not supported",
                param=f"{path}.image_url",
            )
        image: dict[str, Any] = {"url": url}
        if isinstance(part.get("detail"), str):
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    raise InvalidRequest(
        f"content part type {kind!r} is not supported; expected input_text, output_text, "
        "refusal or input_image",
        param=f"{path}.type",
    )


def _append_tool_call(messages: list[dict[str, Any]], item: dict[str, Any], path: str) -> None:
    """A function or custom tool call in the history, as the chat call the model made."""
    custom = item.get("type") == "custom_tool_call"
    for field in ("call_id", "name", "input" if custom else "arguments"):
        if not isinstance(item.get(field), str):
            raise InvalidRequest(f"`{path}.{field}` must be a string", param=f"{path}.{field}")
    namespace = item.get("namespace")
    if namespace is not None and not isinstance(namespace, str):
        raise InvalidRequest(f"`{path}.namespace` must be a string", param=f"{path}.namespace")
    if not custom:  # a template that reads arguments as an object fails on others
        check_arguments(item["arguments"], f"{path}.arguments")
    arguments = custom_arguments(item["input"]) if custom else item["arguments"]
    call = {
        "id": item["call_id"],
        "type": "function",
        "function": {"name": chat_name(item["name"], namespace), "arguments": arguments},
    }
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant" and not isinstance(last["content"], list):
        last.setdefault("tool_calls", []).append(call)
    else:
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})


def _tool_message(item: dict[str, Any], path: str) -> dict[str, Any]:
    call_id = item.get("call_id")
    if not isinstance(call_id, str):
        raise InvalidRequest(f"`{path}.call_id` must be a string", param=f"{path}.call_id")
    output = item.get("output")
    if isinstance(output, list):
        parts = [_chat_part(p, f"{path}.output[{i}]", "tool") for i, p in enumerate(output)]
        output = "\n".join(part["text"] for part in parts)
    if not isinstance(output, str):
        raise InvalidRequest(
            f"`{path}.output` must be a string or a list of text parts", param=f"{path}.output"
        )
    return {"role": "tool", "tool_call_id": call_id, "content": output}


def _response_format(text: Any) -> dict[str, Any] | None:
    if text is None:
        return None
    if not isinstance(text, dict):
        raise InvalidRequest("`text` must be an object", param="text")
    fmt = text.get("format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind != "json_schema" or not isinstance(fmt, dict):
        raise InvalidRequest(
            "`text.format.type` must be text, json_object or json_schema",
            param="text.format.type",
        )
    if not isinstance(fmt.get("name"), str):
        raise InvalidRequest("`text.format.name` is required", param="text.format.name")
    if not isinstance(fmt.get("schema"), dict):
        raise InvalidRequest(
            "`text.format.schema` must be a JSON schema object", param="text.format.schema"
        )
    schema = {k: fmt[k] for k in ("name", "schema", "description", "strict") if k in fmt}
    return {"type": "json_schema", "json_schema": schema}
