"""``backend_error_body``: whatever a backend says in an error, the client gets
OpenAI's error object, with ``code`` a string or null and ``param`` present."""

from __future__ import annotations

import json
from typing import Any

import pytest

from slm_server.router.upstream.client import backend_error_body


def shaped(status: int, content: bytes) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(backend_error_body(status, content))
    assert set(body) == {"error"}
    error: dict[str, Any] = body["error"]
    assert {"message", "type", "param", "code"} <= set(error)
    assert error["code"] is None or isinstance(error["code"], str)
    return error


def test_llama_server_integer_code_becomes_a_string() -> None:
    raw = b'{"error":{"code":400,"message":"bad input","type":"invalid_request_error"}}'
    assert shaped(400, raw) == {
        "code": "400",
        "message": "bad input",
        "type": "invalid_request_error",
        "param": None,
    }


def test_an_openai_shaped_error_is_kept_with_its_extras() -> None:
    raw = json.dumps(
        {"error": {"message": "m", "type": "t", "param": "model", "code": "x", "n_ctx": 9}}
    ).encode()
    assert shaped(404, raw) == {
        "message": "m",
        "type": "t",
        "param": "model",
        "code": "x",
        "n_ctx": 9,
    }


def test_a_null_code_stays_null() -> None:
    assert shaped(500, b'{"error": {"message": "m", "type": "t", "code": null}}')["code"] is None


def test_a_string_error_becomes_the_message() -> None:
    error = shaped(503, b'{"error": "Loading model"}')
    assert (error["message"], error["type"], error["code"]) == (
        "Loading model",
        "backend_error",
        None,
    )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param(b"upstream exploded\n", "upstream exploded", id="plain-text"),
        pytest.param(b"", "HTTP 502", id="empty"),
        pytest.param(b"[1, 2]", "[1, 2]", id="not-an-object"),
        pytest.param(b'{"detail": "nope"}', '{"detail": "nope"}', id="no-error-key"),
    ],
)
def test_anything_else_becomes_the_message(content: bytes, message: str) -> None:
    error = shaped(502, content)
    assert error == {"message": message, "type": "backend_error", "param": None, "code": "502"}


def test_a_long_text_body_is_cut() -> None:
    assert len(shaped(500, b"x" * 100_000)["message"]) == 2000


def test_deep_nesting_is_a_message_not_a_crash() -> None:
    raw = b"[" * 100_000 + b"]" * 100_000
    error = shaped(500, raw)
    assert error["code"] == "500"
    assert len(error["message"]) == 2000


def test_a_non_string_param_is_dropped_and_a_missing_message_filled() -> None:
    error = shaped(400, b'{"error": {"param": 7, "type": "x"}}')
    assert (error["param"], error["message"]) == (None, "HTTP 400")


def test_nan_in_the_extras_never_reaches_the_client() -> None:
    error = shaped(500, b'{"error": {"message": "m", "type": "t", "score": NaN}}')
    assert "score" not in error
    assert backend_error_body(500, b'{"error": {"message": "m", "score": NaN}}').find(b"NaN") == -1
