"""A Messages API request, checked and translated into a chat completions request. Pure.

What chat completions cannot express, or what a backend would fail on with a 5xx of its
own (counted against it by the watchdog), is refused here with a 400 naming the field,
before anything is sent: the Anthropic API's own rules for the body (``max_tokens``
required, roles, block types, every ``tool_result`` answering a ``tool_use`` of the
message before it and every ``tool_use`` answered in the next one), and images for a
model that takes none.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from slm_server.errors import InvalidRequest
from slm_server.router.apis.messages.tools import chat_tool_choice, chat_tools

# Fields of a Messages request the translation reads.
READ_FIELDS = frozenset(
    {
        "model",
        "max_tokens",
        "messages",
        "system",
        "stop_sequences",
        "stream",
        "temperature",
        "top_p",
        "top_k",
        "metadata",
        "tools",
        "tool_choice",
        "thinking",
    }
)
# Anthropic-only fields a local backend has no use for: accepted and dropped.
DROPPED_FIELDS = frozenset(
    {
        "service_tier",
        "container",
        "context_management",
        "output_config",
        "inference_geo",
        "cache_control",
        "speed",
    }
)
# Sampling fields copied as they are (checked to be numbers).
NUMBER_FIELDS = ("temperature", "top_p", "top_k")
# Claude Code's first system block: a per-request billing line that would defeat the
# backend's prompt cache (llama-server's own /v1/messages drops it too).
BILLING_HEADER = "x-anthropic-billing-header:"
IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
TOOL_RESULT_ERROR_PREFIX = "Error: "
# The least thinking budget Anthropic's API takes with ``thinking.type: enabled``.
MIN_THINKING_BUDGET = 1024


def messages_to_chat(
    body: dict[str, Any], *, takes_images: bool, counting: bool = False
) -> dict[str, Any]:
    """The chat completions request for Messages request ``body``.

    ``system`` becomes a leading system message (a ``system`` message, one in its
    place); each message's blocks become chat
    messages (``tool_result`` blocks become ``tool`` messages ahead of the rest of their
    user message, ``tool_use`` blocks the assistant's ``tool_calls``, thinking blocks are
    dropped); ``stop_sequences`` becomes ``stop``; tools and ``tool_choice`` take the chat
    shape; ``thinking`` sets ``chat_template_kwargs.enable_thinking`` unless the request
    sets it. Fields the Messages API does not define (``seed``, ``min_p``,
    ``chat_template_kwargs``, ...) are forwarded; the Anthropic-only ones in
    :data:`DROPPED_FIELDS` and ``metadata`` are dropped. ``takes_images`` says whether the
    model reads images (``model_type: multimodal``); ``counting``, that the request is
    one to ``count_tokens``, which takes no ``max_tokens``.
    """
    chat: dict[str, Any] = {
        k: v for k, v in body.items() if k not in READ_FIELDS and k not in DROPPED_FIELDS
    }
    mcp = chat.pop("mcp_servers", None)
    if mcp:
        raise InvalidRequest(
            "`mcp_servers` is not supported: this gateway runs no MCP connector; run the MCP "
            "servers in the client and send their tools in `tools`",
            param="mcp_servers",
        )
    chat["model"] = body.get("model")
    if not counting or body.get("max_tokens") is not None:
        chat["max_tokens"] = _max_tokens(body.get("max_tokens"))
    messages = _system(body.get("system"))
    messages += _messages(body.get("messages"), takes_images)
    chat["messages"] = messages
    for name in NUMBER_FIELDS:
        value = body.get(name)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InvalidRequest(f"`{name}` must be a number", param=name)
            chat[name] = value
    stop = body.get("stop_sequences")
    if stop is not None:
        if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
            raise InvalidRequest(
                "`stop_sequences` must be a list of non-empty strings", param="stop_sequences"
            )
        if stop:
            chat["stop"] = stop
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise InvalidRequest("`metadata` must be an object", param="metadata")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise InvalidRequest("`stream` must be a boolean", param="stream")
    if stream:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    tools = body.get("tools")
    if tools is not None:
        converted = chat_tools(tools)
        if converted:
            chat["tools"] = converted
    if body.get("tool_choice") is not None:
        chat_tool_choice(body["tool_choice"], chat)
    _thinking(body.get("thinking"), chat)
    return chat


def _max_tokens(value: Any) -> int:
    if value is None:
        raise InvalidRequest("`max_tokens` is required", param="max_tokens")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidRequest("`max_tokens` must be a positive integer", param="max_tokens")
    return value


def _system(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    if isinstance(value, str):
        return [{"role": "system", "content": value}] if value else []
    if not isinstance(value, list):
        raise InvalidRequest("`system` must be a string or a list of text blocks", param="system")
    texts: list[str] = []
    for index, block in enumerate(value):
        path = f"system[{index}]"
        text = _text_of(block, path)
        if not text.startswith(BILLING_HEADER):
            texts.append(text)
    return [{"role": "system", "content": "\n".join(texts)}] if texts else []


def _text_of(block: Any, path: str) -> str:
    if not isinstance(block, dict) or block.get("type") != "text":
        raise InvalidRequest(f"`{path}` must be a text block", param=path)
    text = block.get("text")
    if not isinstance(text, str):
        raise InvalidRequest(f"`{path}.text` must be a string", param=f"{path}.text")
    return text


def _messages(value: Any, takes_images: bool) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise InvalidRequest("`messages` must be a non-empty list", param="messages")
    chat: list[dict[str, Any]] = []
    awaited: list[str] = []  # tool_use ids the next message must answer
    for index, message in enumerate(value):
        path = f"messages[{index}]"
        if not isinstance(message, dict):
            raise InvalidRequest(f"`{path}` must be an object", param=path)
        role = message.get("role")
        if role not in ("user", "assistant", "system"):
            raise InvalidRequest(
                f"`{path}.role` must be user, assistant or system", param=f"{path}.role"
            )
        content = message.get("content")
        if isinstance(content, str):
            blocks: list[Any] = [{"type": "text", "text": content}]
        elif isinstance(content, list):
            blocks = content
        else:
            raise InvalidRequest(
                f"`{path}.content` must be a string or a list of content blocks",
                param=f"{path}.content",
            )
        if role == "system":
            if awaited:
                raise _unanswered(awaited, path)
            texts = [_text_of(block, f"{path}.content[{i}]") for i, block in enumerate(blocks)]
            chat.append({"role": "system", "content": "\n".join(texts)})
        elif role == "user":
            chat += _user(blocks, path, takes_images, awaited)
            awaited = []
        else:
            if awaited:
                raise _unanswered(awaited, path)
            assistant, awaited = _assistant(blocks, path)
            chat.append(assistant)
    if awaited:
        raise _unanswered(awaited, f"messages[{len(value) - 1}]")
    return chat


def _unanswered(ids: list[str], path: str) -> InvalidRequest:
    return InvalidRequest(
        f"`tool_use` ids were found without `tool_result` blocks immediately after: "
        f"{', '.join(ids)}; each tool_use block must be answered by a tool_result block "
        "in the next (user) message",
        param=path,
    )


def _user(
    blocks: list[Any], path: str, takes_images: bool, awaited: list[str]
) -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    answered: set[str] = set()
    for index, block in enumerate(blocks):
        where = f"{path}.content[{index}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            parts.append({"type": "text", "text": _text_of(block, where)})
        elif kind == "image":
            parts.append(_image(block, where, takes_images))
        elif kind == "tool_result":
            tool_use_id = block.get("tool_use_id")
            if not isinstance(tool_use_id, str) or tool_use_id not in awaited:
                raise InvalidRequest(
                    f"`{where}.tool_use_id` names no tool_use block of the previous "
                    "(assistant) message",
                    param=f"{where}.tool_use_id",
                )
            if tool_use_id in answered:
                raise InvalidRequest(
                    f"`{where}`: a second tool_result for {tool_use_id}",
                    param=f"{where}.tool_use_id",
                )
            answered.add(tool_use_id)
            tools.append(_tool_result(block, where, tool_use_id))
        else:
            raise InvalidRequest(
                f"content block type {kind!r} is not supported in a user message; expected "
                "text, image or tool_result",
                param=f"{where}.type",
            )
    missing = [i for i in awaited if i not in answered]
    if missing:
        raise _unanswered(missing, path)
    if not parts:
        return tools
    if all(part["type"] == "text" for part in parts):
        return [*tools, {"role": "user", "content": "\n".join(p["text"] for p in parts)}]
    return [*tools, {"role": "user", "content": parts}]


def _image(block: dict[str, Any], path: str, takes_images: bool) -> dict[str, Any]:
    if not takes_images:
        raise InvalidRequest(
            "This model takes no images (its model_type is not multimodal)", param=path
        )
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "url" and isinstance(source, dict) and isinstance(source.get("url"), str):
        return {"type": "image_url", "image_url": {"url": source["url"]}}
    if kind != "base64" or not isinstance(source, dict):
        raise InvalidRequest(
            f"`{path}.source.type` must be base64 or url (file sources are not supported)",
            param=f"{path}.source.type",
        )
    media = source.get("media_type")
    data = source.get("data")
    if media not in IMAGE_TYPES:
        raise InvalidRequest(
            f"`{path}.source.media_type` must be one of {', '.join(sorted(IMAGE_TYPES))}",
            param=f"{path}.source.media_type",
        )
    if not isinstance(data, str) or not data:
        raise InvalidRequest(f"`{path}.source.data` must be base64", param=f"{path}.source.data")
    try:
        base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest(
            f"`{path}.source.data` is not valid base64", param=f"{path}.source.data"
        ) from None
    return {"type": "image_url", "image_url": {"url": f"data:{media};base64,{data}"}}


def _tool_result(block: dict[str, Any], path: str, tool_use_id: str) -> dict[str, Any]:
    content = block.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    elif isinstance(content, list):
        texts = []
        for index, part in enumerate(content):
            where = f"{path}.content[{index}]"
            if isinstance(part, dict) and part.get("type") == "image":
                raise InvalidRequest(
                    "images in a tool_result are not supported: a chat tool message holds "
                    "text only",
                    param=where,
                )
            texts.append(_text_of(part, where))
        text = "\n".join(texts)
    else:
        raise InvalidRequest(
            f"`{path}.content` must be a string or a list of text blocks",
            param=f"{path}.content",
        )
    is_error = block.get("is_error")
    if is_error is not None and not isinstance(is_error, bool):
        raise InvalidRequest(f"`{path}.is_error` must be a boolean", param=f"{path}.is_error")
    if is_error:
        text = TOOL_RESULT_ERROR_PREFIX + text
    return {"role": "tool", "tool_call_id": tool_use_id, "content": text}


def _assistant(blocks: list[Any], path: str) -> tuple[dict[str, Any], list[str]]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    ids: list[str] = []
    for index, block in enumerate(blocks):
        where = f"{path}.content[{index}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(_text_of(block, where))
        elif kind == "tool_use":
            assert isinstance(block, dict)
            call_id, name, arguments = block.get("id"), block.get("name"), block.get("input")
            if not isinstance(call_id, str) or not call_id:
                raise InvalidRequest(f"`{where}.id` must be a string", param=f"{where}.id")
            if call_id in ids:
                raise InvalidRequest(f"`{where}.id` repeats {call_id}", param=f"{where}.id")
            if not isinstance(name, str) or not name:
                raise InvalidRequest(f"`{where}.name` must be a string", param=f"{where}.name")
            if not isinstance(arguments, dict):
                raise InvalidRequest(f"`{where}.input` must be an object", param=f"{where}.input")
            ids.append(call_id)
            calls.append(
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(arguments)},
                }
            )
        elif kind not in ("thinking", "redacted_thinking"):
            raise InvalidRequest(
                f"content block type {kind!r} is not supported in an assistant message; "
                "expected text, tool_use, thinking or redacted_thinking",
                param=f"{where}.type",
            )
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if calls:
        message["tool_calls"] = calls
    return message, ids


def _thinking(value: Any, chat: dict[str, Any]) -> None:
    """``thinking`` as ``chat_template_kwargs.enable_thinking``; its ``budget_tokens``
    checked (:func:`_check_budget`) and not sent on."""
    if value is None:
        return
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in ("enabled", "disabled", "adaptive"):
        raise InvalidRequest(
            "`thinking.type` must be enabled, disabled or adaptive", param="thinking.type"
        )
    assert isinstance(value, dict)
    budget = value.get("budget_tokens")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int)):
        raise InvalidRequest(
            "`thinking.budget_tokens` must be an integer", param="thinking.budget_tokens"
        )
    if kind == "enabled":
        _check_budget(budget)
    kwargs = chat.get("chat_template_kwargs", {})
    if not isinstance(kwargs, dict):
        raise InvalidRequest(
            "`chat_template_kwargs` must be an object", param="chat_template_kwargs"
        )
    chat["chat_template_kwargs"] = {"enable_thinking": kind != "disabled", **kwargs}


def _check_budget(budget: int | None) -> None:
    """Refuse an ``enabled`` thinking's budget as Anthropic's API does: required, at
    least :data:`MIN_THINKING_BUDGET`. Not refused: a budget at or past ``max_tokens``,
    which Anthropic's API takes with interleaved thinking (which Claude Code asks for),
    and which a preset's cap on ``max_tokens`` would otherwise turn into a refusal of a
    request the client sent right. The budget bounds nothing here: no backend is sent a
    per-request thinking budget (the pinned llama-server's own changed nothing when
    measured), so ``max_tokens`` alone bounds thinking and answer together."""
    if budget is None:
        raise InvalidRequest(
            "`thinking.budget_tokens` is required when `thinking.type` is enabled (an "
            f"integer of at least {MIN_THINKING_BUDGET})",
            param="thinking.budget_tokens",
        )
    if budget < MIN_THINKING_BUDGET:
        raise InvalidRequest(
            f"`thinking.budget_tokens` must be at least {MIN_THINKING_BUDGET}, got {budget}",
            param="thinking.budget_tokens",
        )


__all__ = ["messages_to_chat"]
