"""The pure parts of Ollama's endpoints: a backend's error answer of any shape as
Ollama's ``{"error": "..."}``, the embeddings' inputs, and ``keep_alive: 0`` refused
for a model kept loaded for good."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slm_server.errors import InvalidRequest, ModelConflict
from slm_server.router.apis.ollama.endpoint import _inputs, keep_alive_of, ollama_error
from tests.registry_entries import model_spec


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"error": {"code": 500, "message": "Loading model", "type": "x"}}', "Loading model"),
        (b'{"error": "boom"}', "boom"),
        (b"  <h1>Bad gateway</h1>\n", "<h1>Bad gateway</h1>"),
        (b'{"error": {"message": 5}}', '{"error": {"message": 5}}'),
        (b"", "the backend answered 503"),
        (b"\xff\xfe", "\ufffd\ufffd"),
        (b"[" * 100_000, "[" * 2000),
    ],
    ids=["openai", "ollama", "html", "odd-message", "empty", "not-utf8", "deep"],
)
def test_a_backends_error_is_ollamas_error(content: bytes, message: str) -> None:
    assert json.loads(ollama_error(503, content)) == {"error": message}


@settings(max_examples=200, derandomize=True, database=None, deadline=None)
@given(content=st.binary(max_size=300))
def test_any_error_answer_is_one_ollama_error(content: bytes) -> None:
    found = json.loads(ollama_error(500, content))
    assert set(found) == {"error"}
    assert isinstance(found["error"], str) and found["error"]


@pytest.mark.parametrize(
    ("legacy", "payload", "inputs"),
    [
        (False, {"input": "a"}, ["a"]),
        (False, {"input": ["a", "b"]}, ["a", "b"]),
        (False, {"input": ""}, []),  # asks nothing: loads the model
        (False, {"input": []}, []),
        (False, {}, []),
        (True, {"prompt": "a"}, ["a"]),
        (True, {"prompt": ""}, [""]),
    ],
)
def test_the_embeddings_inputs(legacy: bool, payload: dict[str, Any], inputs: list[str]) -> None:
    assert _inputs(payload, legacy) == inputs


@pytest.mark.parametrize(
    ("legacy", "payload", "named"),
    [
        (False, {"input": 1}, "input"),
        (False, {"input": ["a", 1]}, "input"),
        (False, {"input": {"a": "b"}}, "input"),
        (True, {"prompt": ["a"]}, "prompt"),
        (True, {"prompt": 1}, "prompt"),
    ],
)
def test_embeddings_inputs_of_the_wrong_type_are_a_400(
    legacy: bool, payload: dict[str, Any], named: str
) -> None:
    with pytest.raises(InvalidRequest) as refused:
        _inputs(payload, legacy)
    assert refused.value.param == named


def test_keep_alive_zero_never_unloads_a_model_kept_for_good() -> None:
    kept = model_spec()
    with pytest.raises(ModelConflict) as refused:
        keep_alive_of(kept, {"keep_alive": 0})
    assert refused.value.status == 409 and refused.value.param == "keep_alive"
    assert keep_alive_of(kept, {"keep_alive": "5m"}) == 300.0
    lazy = model_spec(load="on_demand")
    assert keep_alive_of(lazy, {"keep_alive": "0s"}) == 0.0
    assert keep_alive_of(lazy, {}) is None
