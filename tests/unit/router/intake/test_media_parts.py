"""Images and audio for a model that reads text only are refused with a 400 naming the
part, on chat completions and the Responses API; text, and any part for a multimodal
model, passes (what the pinned llama-server answers: see
tests/integration/test_tool_call_refusals.py)."""

from __future__ import annotations

from typing import Any

import pytest

from slm_server.errors import InvalidRequest
from slm_server.router.intake.media_parts import check_media
from slm_server.router.intake.payload import check_fields
from tests.shape_rows import shape

CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
TEXT = {"type": "text", "text": "What is this?"}
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
AUDIO = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
INPUT_TEXT = {"type": "input_text", "text": "What is this?"}
INPUT_IMAGE = {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}


def chat(*messages: dict[str, Any]) -> dict[str, Any]:
    return {"model": "m", "messages": list(messages)}


def responses(*items: Any) -> dict[str, Any]:
    return {"model": "m", "input": list(items)}


def user(*parts: Any) -> dict[str, Any]:
    return {"role": "user", "content": list(parts)}


REFUSED: dict[str, tuple[str, dict[str, Any], str]] = {
    "chat image after text": (CHAT, chat(user(TEXT, IMAGE)), "messages[0].content[1]"),
    "chat image alone": (CHAT, chat(user(IMAGE)), "messages[0].content[0]"),
    "chat audio": (CHAT, chat(user(TEXT, AUDIO)), "messages[0].content[1]"),
    "chat image in a later turn": (
        CHAT,
        chat(user(TEXT), {"role": "assistant", "content": "A cat."}, user(IMAGE)),
        "messages[2].content[0]",
    ),
    "chat image in a system message": (
        CHAT,
        chat({"role": "system", "content": [IMAGE]}, user(TEXT)),
        "messages[0].content[0]",
    ),
    "chat image without its url": (
        CHAT,
        chat(user({"type": "image_url"})),
        "messages[0].content[0]",
    ),
    "responses image": (
        RESPONSES,
        responses({"role": "user", "content": [INPUT_TEXT, INPUT_IMAGE]}),
        "input[0].content[1]",
    ),
    "responses image in a typed message": (
        RESPONSES,
        responses({"type": "message", "role": "user", "content": [INPUT_IMAGE]}),
        "input[0].content[0]",
    ),
    "responses image in a tool output": (
        RESPONSES,
        responses(
            {"role": "user", "content": "Look"},
            {"type": "function_call_output", "call_id": "c", "output": [INPUT_IMAGE]},
        ),
        "input[1].output[0]",
    ),
}

SERVED: dict[str, tuple[str, dict[str, Any]]] = {
    "chat string content": (CHAT, chat({"role": "user", "content": "hi"})),
    "chat text parts": (CHAT, chat(user(TEXT, TEXT))),
    "chat null content with tool calls": (
        CHAT,
        chat(user(TEXT), {"role": "assistant", "content": None, "tool_calls": []}),
    ),
    "chat a part llama-server refuses itself": (CHAT, chat(user({"type": "file", "file": {}}))),
    "chat a part that is not an object": (CHAT, chat(user("x"))),
    "chat no messages": (CHAT, {"model": "m"}),
    "chat messages not a list": (CHAT, {"model": "m", "messages": "x"}),
    "chat a Responses part on chat": (CHAT, chat(user(INPUT_IMAGE))),
    "responses string input": (RESPONSES, {"model": "m", "input": "hi"}),
    "responses text parts": (RESPONSES, responses({"role": "user", "content": [INPUT_TEXT]})),
    "responses string tool output": (
        RESPONSES,
        responses({"type": "function_call_output", "call_id": "c", "output": "sunny"}),
    ),
    "responses a chat part on Responses": (RESPONSES, responses(user(IMAGE))),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_media_for_a_text_model_is_refused_naming_the_part(name: str) -> None:
    endpoint, payload, param = REFUSED[name]
    with pytest.raises(InvalidRequest) as refused:
        check_fields(payload, shape(endpoint), model_type="lm")
    assert refused.value.status == 400
    assert refused.value.param == param
    assert f"`{param}`" in refused.value.message
    assert "model_type is lm, not multimodal" in refused.value.message


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_multimodal_model_is_sent_every_part(name: str) -> None:
    endpoint, payload, _param = REFUSED[name]
    check_media(payload, shape(endpoint).name, "multimodal")


@pytest.mark.parametrize("name", sorted(SERVED))
def test_text_passes_for_a_text_model(name: str) -> None:
    endpoint, payload = SERVED[name]
    check_media(payload, shape(endpoint).name, "lm")


def test_other_endpoints_are_not_checked_so() -> None:
    body = {**chat(user(IMAGE)), **responses({"role": "user", "content": [INPUT_IMAGE]})}
    for endpoint in ("/v1/completions", "/v1/embeddings", "/v1/messages"):
        check_media(body, shape(endpoint).name, "lm")
