"""Decoding whole answers for the request's record: what the record reads is the same
as with a full decode."""

from __future__ import annotations

import json
from typing import Any

import pytest

from slm_server.router.answer.answer_fields import answer_fields
from slm_server.router.apis.table import TABLE
from slm_server.router.call.exchange import Exchange

CHAT_PATH = "/v1/chat/completions"

CHAT = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "model": "m",
    "choices": [
        {"index": 0, "finish_reason": "stop", "logprobs": {"p": -0.25}},
        {"index": 1, "finish_reason": "length"},
    ],
    "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10},
    "timings": {"predicted_ms": 12.5},
}
EMBEDDINGS = {
    "object": "list",
    "model": "e",
    "data": [
        {"object": "embedding", "index": i, "embedding": [0.5, -1.25e-3, 3.0]} for i in range(3)
    ],
    "usage": {"prompt_tokens": 4, "total_tokens": 4},
}


def recorded(body: dict[str, Any]) -> Exchange:
    exchange = Exchange(request_id="r", method="POST", path=CHAT_PATH, shape=TABLE.at(CHAT_PATH))
    exchange.note_response(body)
    return exchange


@pytest.mark.parametrize("answer", [CHAT, EMBEDDINGS])
def test_the_record_is_the_same_as_with_a_full_decode(answer: dict[str, Any]) -> None:
    content = json.dumps(answer).encode()
    fields = answer_fields(content)
    assert fields is not None
    assert vars(recorded(fields)) | {"started": 0} == vars(recorded(json.loads(content))) | {
        "started": 0
    }


def test_floats_stay_text_and_everything_else_decodes() -> None:
    assert answer_fields(b'{"a": 1.5e3, "b": 2, "c": [true, null, "x"]}') == {
        "a": "1.5e3",
        "b": 2,
        "c": [True, None, "x"],
    }
    assert answer_fields('{"é": 1}'.encode("utf-16")) == {"é": 1}


@pytest.mark.parametrize("content", [b"", b"[1, 2]", b'"text"', b"{nope", b"\xff\xfe\xfd"])
def test_anything_but_a_json_object_is_none(content: bytes) -> None:
    assert answer_fields(content) is None
