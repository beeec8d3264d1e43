"""An Ollama ``/api/chat`` or ``/api/generate`` request, checked and translated into a
chat completions request (a raw ``/api/generate``: a completions request). Pure.

What the backend would fail on with a 5xx of its own, or what chat completions cannot
say, is refused with a 400 naming the field: a role Ollama does not have, images for a
model that takes none (or that are not base64 images), a tool result with no call to
answer, a ``template`` of the request's own. Ollama's tool calls carry no ids: each
call of an assistant message gets one, and each ``tool`` message answers the first
call of the messages before it that is not answered yet, by ``tool_name`` when it
names one (or by ``tool_call_id``).
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any, Final

from slm_server.errors import InvalidRequest
from slm_server.router.apis.ollama.options import (
    Sampling,
    response_format,
    sampling,
    think_fields,
    thinking,
)

ROLES: Final = frozenset({"system", "user", "assistant", "tool"})
# The first bytes of each image type a vision model's server decodes.
_IMAGE_MAGIC: Final = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)


@dataclass(frozen=True, slots=True)
class Translated:
    """An Ollama request as its backend is sent it: the body, the backend path's kind
    (``chat`` or, for a raw prompt, ``completions``), the options left alone, whether
    it streams, what it asked of thinking, and whether it asks nothing (a generate
    request with no prompt: Ollama's way to load, or unload, a model)."""

    body: dict[str, Any]
    kind: str
    ignored: tuple[str, ...]
    stream: bool
    think: bool | str | None
    empty: bool = False
    keep_alive: float | None = None  # seconds (set before admission, from the request)


def _bad(message: str, param: str) -> InvalidRequest:
    return InvalidRequest(message, param=param)


def _stream(body: dict[str, Any]) -> bool:
    """Ollama streams unless told not to."""
    value = body.get("stream", True)
    if value is None:
        return True
    if not isinstance(value, bool):
        raise _bad("stream must be true or false", "stream")
    return value


def _text(value: Any, param: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _bad(f"{param} must be a string", param)
    return value


def image_part(data: Any, param: str) -> dict[str, Any]:
    """An Ollama image (base64, as its clients send file contents) as a chat image
    part with its media type read from its first bytes."""
    if not isinstance(data, str) or not data:
        raise _bad(f"{param} must be a base64-encoded image", param)
    text = data.split(",", 1)[1] if data.startswith("data:") and "," in data else data
    try:
        head = base64.b64decode(text[:64] + "=" * (-len(text[:64]) % 4), validate=True)
        base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise _bad(f"{param} is not valid base64", param) from None
    media = next((kind for magic, kind in _IMAGE_MAGIC if head.startswith(magic)), None)
    if media is None and head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        media = "image/webp"
    if media is None:
        raise _bad(f"{param} is not a PNG, JPEG, GIF or WebP image", param)
    return {"type": "image_url", "image_url": {"url": f"data:{media};base64,{text}"}}


def _images(value: Any, param: str, takes_images: bool) -> list[dict[str, Any]]:
    if value is None or value == []:
        return []
    if not isinstance(value, list):
        raise _bad(f"{param} must be a list of base64-encoded images", param)
    if not takes_images:
        raise _bad("this model takes no images (its model_type is not multimodal)", param)
    return [image_part(image, f"{param}[{i}]") for i, image in enumerate(value)]


def _user_content(text: str, images: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    if not images:
        return text
    return [*images, {"type": "text", "text": text}] if text else images


@dataclass
class _Call:
    call_id: str
    name: str
    answered: bool = False


def _arguments(value: Any, param: str) -> str:
    if value is None:
        return "{}"
    if isinstance(value, str):  # some clients send the JSON text, as OpenAI's do
        return value
    if not isinstance(value, dict):
        raise _bad(f"{param} must be an object", param)
    return json.dumps(value, ensure_ascii=False)


def _tool_calls(value: Any, param: str, at: int, open_calls: list[_Call]) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise _bad(f"{param} must be a list", param)
    calls = []
    for i, call in enumerate(value):
        where = f"{param}[{i}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            raise _bad(f"{where}.function must be an object", f"{where}.function")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise _bad(f"{where}.function.name must be a non-empty string", f"{where}.function")
        assert isinstance(call, dict)
        given = call.get("id")
        call_id = given if isinstance(given, str) and given else f"call_{at}_{i}"
        arguments = _arguments(function.get("arguments"), f"{where}.function.arguments")
        calls.append(
            {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
        )
        open_calls.append(_Call(call_id, name))
    return calls


def _answered(message: dict[str, Any], param: str, open_calls: list[_Call]) -> str:
    """The id of the call a ``tool`` message answers."""
    by_id = message.get("tool_call_id")
    name = message.get("tool_name", message.get("name"))
    for field, value in (("tool_call_id", by_id), ("tool_name", name)):
        if value is not None and not isinstance(value, str):
            raise _bad(f"{param}.{field} must be a string", f"{param}.{field}")
    waiting = [call for call in open_calls if not call.answered]
    found = None
    if isinstance(by_id, str) and by_id:
        found = next((c for c in waiting if c.call_id == by_id), None)
    if found is None and isinstance(name, str) and name:
        found = next((c for c in waiting if c.name == name), None)
    if found is None and not (isinstance(name, str) and name) and waiting:
        found = waiting[0]
    if found is None:
        named = f" of '{name}'" if isinstance(name, str) and name else ""
        raise _bad(
            f"{param} is a tool result{named} that answers no tool call of the assistant "
            "messages before it",
            param,
        )
    found.answered = True
    return found.call_id


def chat_messages(value: Any, takes_images: bool) -> list[dict[str, Any]]:
    """Ollama's ``messages`` as chat completions messages."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise _bad("messages must be a list", "messages")
    messages: list[dict[str, Any]] = []
    open_calls: list[_Call] = []
    for at, message in enumerate(value):
        param = f"messages[{at}]"
        if not isinstance(message, dict):
            raise _bad(f"{param} must be an object", param)
        role = message.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise _bad(
                f"{param}.role must be one of system, user, assistant, tool", f"{param}.role"
            )
        content = _text(message.get("content"), f"{param}.content")
        images = _images(message.get("images"), f"{param}.images", takes_images)
        if role == "tool":
            call_id = _answered(message, param, open_calls)
            messages.append({"role": "tool", "tool_call_id": call_id, "content": content})
        elif role == "assistant":
            said: dict[str, Any] = {"role": "assistant", "content": content}
            thought = _text(message.get("thinking"), f"{param}.thinking")
            if thought:
                said["reasoning_content"] = thought
            calls = message.get("tool_calls")
            if calls is not None:
                made = _tool_calls(calls, f"{param}.tool_calls", at, open_calls)
                if made:
                    said["tool_calls"] = made
            if images:
                raise _bad("an assistant message cannot carry images", f"{param}.images")
            messages.append(said)
        else:
            if role == "system" and images:
                raise _bad("a system message cannot carry images", f"{param}.images")
            messages.append({"role": role, "content": _user_content(content, images)})
    return messages


def _tools(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _bad("tools must be a list", "tools")
    tools = []
    for i, tool in enumerate(value):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise _bad(f"tools[{i}].function must be an object with a name", f"tools[{i}]")
        assert isinstance(tool, dict)
        if tool.get("type", "function") != "function":
            raise _bad(f"tools[{i}].type must be function", f"tools[{i}].type")
        tools.append({"type": "function", "function": function})
    return tools


def _common(
    body: dict[str, Any], request: dict[str, Any], options: Sampling, stream: bool
) -> dict[str, Any]:
    """The fields every translation has: the model, the sampling, the bound, the
    format, the stream."""
    request["model"] = body.get("model")
    request.update(options.fields)
    if options.max_tokens is not None:
        request["max_tokens"] = options.max_tokens
    shape = response_format(body.get("format"))
    if shape is not None:
        request["response_format"] = shape
    if body.get("logprobs") is True:
        request["logprobs"] = True
        top = body.get("top_logprobs")
        if top is not None:
            if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= 20:
                raise _bad("top_logprobs must be an integer from 0 to 20", "top_logprobs")
            request["top_logprobs"] = top
    if stream:
        request["stream"] = True
        request["stream_options"] = {"include_usage": True}
    return request


def chat_request(
    body: dict[str, Any], *, takes_images: bool, context_length: int | None
) -> Translated:
    """An ``/api/chat`` request as a chat completions request."""
    stream = _stream(body)
    options = sampling(body.get("options"), context_length)
    think = thinking(body.get("think"))
    chat = _common(body, {}, options, stream)
    chat["messages"] = chat_messages(body.get("messages"), takes_images)
    tools = _tools(body.get("tools"))
    if tools:
        chat["tools"] = tools
    chat.update(think_fields(think))
    empty = not chat["messages"]
    return Translated(chat, "chat", options.ignored, stream, think, empty)


def generate_request(
    body: dict[str, Any], *, takes_images: bool, context_length: int | None
) -> Translated:
    """An ``/api/generate`` request as a chat completions request (the prompt a user
    message after the ``system`` one, the model's template applied by its server), or,
    ``raw``, as a completions request of the prompt as it is. A request with no prompt
    and no images asks nothing (Ollama's way to load a model)."""
    stream = _stream(body)
    options = sampling(body.get("options"), context_length)
    think = thinking(body.get("think"))
    prompt = _text(body.get("prompt"), "prompt")
    system = _text(body.get("system"), "system")
    template = body.get("template")
    if template is not None and not isinstance(template, str):
        raise _bad("template must be a string", "template")
    if template:
        raise _bad(
            "template is not supported: the model's own template is used (set "
            "chat_template_file in the registry to change it), or send raw: true with the "
            "prompt already formatted",
            "template",
        )
    context = body.get("context")
    if context is not None and not (
        isinstance(context, list)
        and all(isinstance(t, int) and not isinstance(t, bool) for t in context)
    ):
        raise _bad("context must be a list of token ids", "context")
    if context:
        raise _bad(
            "context (the token list of an earlier answer) is not supported: send the "
            "conversation to /api/chat instead",
            "context",
        )
    raw = body.get("raw", False)
    if not isinstance(raw, bool):
        raise _bad("raw must be true or false", "raw")
    images = _images(body.get("images"), "images", takes_images)
    suffix = _text(body.get("suffix"), "suffix")
    if suffix:
        return _fill_in(body, prompt, suffix, options, stream, think, images)
    if raw:
        if images:
            raise _bad("images cannot be sent with raw: true", "images")
        completion = _common(body, {"prompt": prompt}, options, stream)
        return Translated(completion, "completions", options.ignored, stream, think, not prompt)
    chat = _common(body, {}, options, stream)
    messages: list[dict[str, Any]] = []
    if system:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": _user_content(prompt, images)})
    chat["messages"] = messages
    chat.update(think_fields(think))
    empty = not prompt and not images
    return Translated(chat, "chat", options.ignored, stream, think, empty)


def _fill_in(
    body: dict[str, Any],
    prompt: str,
    suffix: str,
    options: Sampling,
    stream: bool,
    think: bool | str | None,
    images: list[dict[str, Any]],
) -> Translated:
    """A ``generate`` request with a ``suffix`` (a code editor's completion at the
    cursor: the prompt before it, the suffix after) as llama-server's ``/infill``
    request, which writes the middle with the model's fill-in-the-middle tokens."""
    for name, refused in (("images", images), ("format", body.get("format")), ("think", think)):
        if refused:
            raise _bad(f"{name} is not served with suffix (fill in the middle)", name)
    infill: dict[str, Any] = {"input_prefix": prompt, "input_suffix": suffix, "prompt": ""}
    infill.update(options.fields)
    if options.max_tokens is not None:
        infill["n_predict"] = options.max_tokens
    infill["stream"] = stream
    infill["model"] = body.get("model")
    return Translated(infill, "infill", options.ignored, stream, None)


__all__ = ["Translated", "chat_messages", "chat_request", "generate_request", "image_part"]
