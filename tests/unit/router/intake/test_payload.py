"""Reading and adjusting client request bodies."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.datastructures import Headers

from slm_server.errors import InvalidRequest, UnsupportedMediaType
from slm_server.registry.schema import ModelEntry
from slm_server.router.intake.payload import (
    apply_defaults,
    check_fields,
    check_json_type,
    header_value,
    is_stream,
    model_field,
    parse_body,
)
from slm_server.router.intake.presets import SHAPES, apply_preset, resolve
from tests.registry_entries import model_entry
from tests.shape_rows import shape

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
RESPONSES = "/v1/responses"
EMBEDDINGS = "/v1/embeddings"
RERANK = "/v1/rerank"
KWARGS = {"enable_thinking": False}
SAMPLING = {"temperature": 0.2, "top_k": 20, "max_tokens": 64}


# --- parse_body -------------------------------------------------------------------------


def test_parse_body_object() -> None:
    assert parse_body(b'{"model": "m1", "messages": []}') == {"model": "m1", "messages": []}


def test_parse_body_utf8() -> None:
    assert parse_body('{"input": "héllo ✓"}'.encode()) == {"input": "héllo ✓"}


@pytest.mark.parametrize("raw", [b"", b"   ", b"\n\t "])
def test_parse_body_empty(raw: bytes) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_body(raw)
    assert caught.value.code == "invalid_json"
    assert caught.value.status == 400
    assert caught.value.message == "The request body is empty; send a JSON object"


@pytest.mark.parametrize("raw", [b"{", b"{'a': 1}", b"model=m1", b"\xff\xfe{}", b'{"a": 1}x'])
def test_parse_body_invalid_json(raw: bytes) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_body(raw)
    assert caught.value.code == "invalid_json"
    assert caught.value.message.startswith("The request body is not valid JSON: ")
    assert caught.value.param is None


@pytest.mark.parametrize(
    "raw",
    [
        b'{"t": NaN}',
        b'{"t": 1e999}',
        b'{"c": "\\ud800"}',
        '{"a": 1}'.encode("utf-16"),
        b"[" * 10**5,
    ],
)
def test_parse_body_is_strict(raw: bytes) -> None:
    # Each of these would reach llama-server, whose 500 the watchdog counts against it.
    with pytest.raises(InvalidRequest) as caught:
        parse_body(raw)
    assert caught.value.code == "invalid_json"
    assert caught.value.message.startswith("The request body is not valid JSON: ")


def test_parse_body_skips_a_utf8_bom() -> None:
    assert parse_body(b'\xef\xbb\xbf{"model": "m1"}') == {"model": "m1"}


@pytest.mark.parametrize(
    ("raw", "kind"),
    [(b"[1, 2]", "list"), (b'"text"', "str"), (b"42", "int"), (b"null", "NoneType")],
)
def test_parse_body_not_an_object(raw: bytes, kind: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_body(raw)
    assert caught.value.code == "invalid_json"
    assert caught.value.message == f"The request body must be a JSON object, not {kind}"


# --- model_field --------------------------------------------------------------------------


def test_model_field() -> None:
    assert model_field({"model": "m1"}) == "m1"


@pytest.mark.parametrize("payload", [{}, {"model": None}, {"messages": []}])
def test_model_field_missing(payload: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest) as caught:
        model_field(payload)
    error = caught.value
    assert error.code == "missing_model"
    assert error.param == "model"
    assert error.status == 400
    assert "GET /v1/models" in error.message


@pytest.mark.parametrize("value", [5, "", ["m1"], {"id": "m1"}, True])
def test_model_field_invalid(value: Any) -> None:
    with pytest.raises(InvalidRequest) as caught:
        model_field({"model": value})
    error = caught.value
    assert error.code == "invalid_model"
    assert error.param == "model"
    assert error.message == "The 'model' field must be a non-empty string"


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        ({"stream": True}, True),
        ({"stream": False}, False),
        ({}, False),
        ({"stream": "true"}, False),
    ],
)
def test_is_stream(payload: dict[str, Any], expected: bool) -> None:
    assert is_stream(payload) is expected


# --- apply_defaults, with the registry's chat_template_kwargs ---------------------------------


def complete(
    payload: dict[str, Any], e: ModelEntry, endpoint: str, sampling: dict[str, Any]
) -> bool:
    """What the router adds to a request, as reception does it: the entry's presets
    (its ``chat_template_kwargs`` among them), then the sampling defaults."""
    row = shape(endpoint)
    names = SHAPES.get(row.name)
    changed = False
    if names is not None:
        after = apply_preset(payload, names, resolve(e, None))
        if after is not payload:
            payload.clear()
            payload.update(after)
            changed = True
    return apply_defaults(payload, row, sampling) or changed


@pytest.mark.parametrize("endpoint", [CHAT, RESPONSES])
def test_chat_template_kwargs_injected_when_absent(endpoint: str) -> None:
    e = model_entry(chat_template_kwargs=KWARGS)
    payload: dict[str, Any] = {"model": "m1"}
    assert complete(payload, e, endpoint, {}) is True
    assert payload == {"model": "m1", "chat_template_kwargs": {"enable_thinking": False}}
    payload["chat_template_kwargs"]["enable_thinking"] = True
    assert e.chat_template_kwargs == {"enable_thinking": False}


@pytest.mark.parametrize("endpoint", [CHAT, RESPONSES])
def test_chat_template_kwargs_of_the_request_win(endpoint: str) -> None:
    payload: dict[str, Any] = {"model": "m1", "chat_template_kwargs": {"enable_thinking": True}}
    assert complete(payload, model_entry(chat_template_kwargs=KWARGS), endpoint, {}) is False
    assert payload["chat_template_kwargs"] == {"enable_thinking": True}


def test_explicit_null_chat_template_kwargs_is_kept() -> None:
    payload: dict[str, Any] = {"model": "m1", "chat_template_kwargs": None}
    assert complete(payload, model_entry(chat_template_kwargs=KWARGS), CHAT, {}) is False
    assert payload["chat_template_kwargs"] is None


@pytest.mark.parametrize("endpoint", [COMPLETIONS, EMBEDDINGS, RERANK])
def test_chat_template_kwargs_only_for_chat_endpoints(endpoint: str) -> None:
    payload: dict[str, Any] = {"model": "m1"}
    assert complete(payload, model_entry(chat_template_kwargs=KWARGS), endpoint, {}) is False
    assert payload == {"model": "m1"}


def test_no_chat_template_kwargs_in_entry() -> None:
    payload: dict[str, Any] = {"model": "m1"}
    assert complete(payload, model_entry(), CHAT, {}) is False
    assert payload == {"model": "m1"}


@pytest.mark.parametrize("endpoint", [CHAT, COMPLETIONS])
def test_sampling_defaults_fill_only_what_is_absent(endpoint: str) -> None:
    payload: dict[str, Any] = {"model": "m1", "temperature": 0.9, "max_tokens": None}
    assert complete(payload, model_entry(), endpoint, SAMPLING) is True
    assert payload == {"model": "m1", "temperature": 0.9, "max_tokens": None, "top_k": 20}


@pytest.mark.parametrize("endpoint", [CHAT, COMPLETIONS])
def test_sampling_defaults_all_present_is_no_change(endpoint: str) -> None:
    payload: dict[str, Any] = {"model": "m1", "temperature": 1, "top_k": 1, "max_tokens": 1}
    before = dict(payload)
    assert complete(payload, model_entry(), endpoint, SAMPLING) is False
    assert payload == before


@pytest.mark.parametrize("endpoint", [RESPONSES, EMBEDDINGS, RERANK])
def test_sampling_defaults_not_for_other_endpoints(endpoint: str) -> None:
    payload: dict[str, Any] = {"model": "m1"}
    assert complete(payload, model_entry(), endpoint, SAMPLING) is False
    assert payload == {"model": "m1"}


def test_both_defaults_on_chat() -> None:
    payload: dict[str, Any] = {"model": "m1", "messages": []}
    assert complete(payload, model_entry(chat_template_kwargs=KWARGS), CHAT, SAMPLING) is True
    assert payload == {
        "model": "m1",
        "messages": [],
        "chat_template_kwargs": KWARGS,
        "temperature": 0.2,
        "top_k": 20,
        "max_tokens": 64,
    }


def test_kwargs_present_but_sampling_added_still_reports_change() -> None:
    payload: dict[str, Any] = {"model": "m1", "chat_template_kwargs": {}}
    assert complete(payload, model_entry(chat_template_kwargs=KWARGS), CHAT, {"top_p": 1}) is True
    assert payload == {"model": "m1", "chat_template_kwargs": {}, "top_p": 1}


@pytest.mark.parametrize("top_n", [0, -1, -100, "3", 2.5, True, None, [1]])
def test_rerank_top_n_must_be_a_positive_integer(top_n: object) -> None:
    with pytest.raises(InvalidRequest) as caught:
        check_fields(
            {"model": "m", "query": "q", "documents": ["d"], "top_n": top_n},
            shape("/v1/rerank"),
            model_type="rerank",
        )
    assert caught.value.code == "invalid_top_n"


@pytest.mark.parametrize("top_n", [1, 2, 1000])
def test_rerank_top_n_in_range_passes(top_n: int) -> None:
    check_fields(
        {"model": "m", "query": "q", "documents": ["d"], "top_n": top_n},
        shape("/v1/rerank"),
        model_type="rerank",
    )


def test_top_n_is_only_checked_on_rerank() -> None:
    check_fields({"model": "m", "top_n": -1}, shape("/v1/embeddings"), model_type="embeddings")
    check_fields({"model": "m"}, shape("/v1/rerank"), model_type="rerank")


@pytest.mark.parametrize(
    "content_type",
    ["application/json", "application/json; charset=utf-8", "APPLICATION/JSON",
     "application/vnd.api+json"],
)  # fmt: skip
def test_json_content_types_pass(content_type: str) -> None:
    check_json_type(content_type)


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "text/plain; charset=utf-8", "application/x-www-form-urlencoded",
     "multipart/form-data; boundary=x", "", "application/jsonx", "text/json", None],
)  # fmt: skip
def test_other_content_types_are_415(content_type: str | None) -> None:
    with pytest.raises(UnsupportedMediaType) as refused:
        check_json_type(content_type)
    assert refused.value.status == 415
    assert refused.value.code == "unsupported_media_type"
    assert "application/json" in refused.value.message


NAMES = st.sampled_from([b"content-type", b"content-length", b"x-request-timeout", b"host"])


@given(
    headers=st.lists(st.tuples(NAMES, st.binary(max_size=8)), max_size=6),
    name=NAMES,
)
def test_a_header_value_is_what_starlettes_headers_give(
    headers: list[tuple[bytes, bytes]], name: bytes
) -> None:
    assert header_value(headers, name) == Headers(raw=headers).get(name.decode())


def test_a_header_value_is_the_first_of_its_name() -> None:
    headers = [(b"host", b"a"), (b"content-type", b"text/plain"), (b"content-type", b"x")]
    assert header_value(headers, b"content-type") == "text/plain"
    assert header_value(headers, b"x-request-timeout") is None
    assert header_value([(b"x-a", b"\xe9")], b"x-a") == "\u00e9"
