"""Images and audio sent to a model that reads neither, refused before they reach its
backend. Pure.

The pinned llama-server, run without a multimodal projector (``--mmproj``), answers a
chat completions request with an ``image_url`` or ``input_audio`` part in any message
(any role, streamed or not) with a 500 ("image input is not supported"), and so does its
own ``/v1/responses`` for an ``input_image``; the watchdog would count it against a
healthy backend. An entry whose ``model_type`` is not ``multimodal`` has no projector,
so :func:`check_media` refuses such a part with a 400 naming it (``messages[2].content[1]``,
``input[0].content[1]``), whatever the backend: the entry says what its model reads.
Text (a string content, ``text``/``input_text`` parts) and every part llama-server
already refuses with a 400 of its own (``file``, an unknown type) pass untouched. The
Messages API refuses its image blocks in its translation
(:func:`~slm_server.router.apis.messages.to_chat.messages_to_chat`); ``/v1/completions``'
``multimodal_data`` llama-server answers 400 itself.
"""

from __future__ import annotations

from typing import Any

from slm_server.errors import InvalidRequest

# The media part types each request shape has (by the shape's name), by what they carry.
MEDIA_PARTS: dict[str, dict[str, str]] = {
    "chat": {"image_url": "an image", "input_audio": "audio"},
    "responses": {"input_image": "an image", "input_audio": "audio"},
}
# The fields of a message (or input item) that hold content parts.
CHAT_FIELDS: tuple[str, ...] = ("content",)
RESPONSES_FIELDS: tuple[str, ...] = ("content", "output")


def check_media(payload: dict[str, Any], shape: str, model_type: str) -> None:
    """Refuse (400 naming the part) an image or audio part in a chat completions
    ``messages[i].content`` or a Responses ``input[i].content`` (or a tool output's
    ``input[i].output``) when ``model_type`` is not ``multimodal``; anything else
    passes."""
    kinds = MEDIA_PARTS.get(shape)
    if kinds is None or model_type == "multimodal":
        return
    name, fields = ("messages", CHAT_FIELDS) if shape == "chat" else ("input", RESPONSES_FIELDS)
    items = payload.get(name)
    if not isinstance(items, list):
        return
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            continue
        for field in fields:
            parts = item.get(field)
            if isinstance(parts, list):
                _parts(parts, f"{name}[{index}].{field}", kinds, model_type)


def check_chat_media(payload: dict[str, Any], model_type: str) -> None:
    """:func:`check_media` on a chat completions request."""
    check_media(payload, "chat", model_type)


def check_responses_media(payload: dict[str, Any], model_type: str) -> None:
    """:func:`check_media` on a Responses request."""
    check_media(payload, "responses", model_type)


def _parts(parts: list[Any], path: str, kinds: dict[str, str], model_type: str) -> None:
    for index, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        carries = kinds.get(kind) if isinstance(kind, str) else None
        if carries is not None:
            where = f"{path}[{index}]"
            raise InvalidRequest(
                f"`{where}` is {carries} ({kind}), and this model reads text only: its "
                f"model_type is {model_type}, not multimodal",
                param=where,
            )


__all__ = ["check_chat_media", "check_media", "check_responses_media"]
