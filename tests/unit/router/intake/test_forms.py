"""Finding the routing fields of a multipart/form-data body without re-encoding it."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from slm_server.errors import InvalidRequest
from slm_server.router.intake.forms import (
    MAX_PART_HEADER_BYTES,
    MAX_PARTS,
    form_boundary,
    form_fields,
    read_form_fields,
)
from slm_server.router.intake.payload import model_field

BOUNDARY = "b0undary"
FORM = f"multipart/form-data; boundary={BOUNDARY}"
# A file whose bytes look like line ends, near-boundaries and a part's headers.
TRICKY = (
    b"\x00\xff\r\n\r\n--b0undar\r\n--b0undary-\r\n--b0undaryx\r\n"
    b'Content-Disposition: form-data; name="model"\r\n\r\nevil\r\n\r'
)


def field(name: str, value: bytes | str, extra: str = "") -> bytes:
    data = value.encode() if isinstance(value, str) else value
    head = f'Content-Disposition: form-data; name="{name}"{extra}\r\n\r\n'.encode()
    return f"--{BOUNDARY}\r\n".encode() + head + data + b"\r\n"


def upload(name: str, data: bytes, filename: str = "a.wav") -> bytes:
    extra = f'; filename="{filename}"\r\nContent-Type: application/octet-stream'
    return field(name, data, extra)


def form(*parts: bytes) -> bytes:
    return b"".join(parts) + f"--{BOUNDARY}--\r\n".encode()


def encoded(data: dict[str, Any], files: dict[str, Any]) -> tuple[bytes, str]:
    """A body and content type as a real client (httpx) encodes them."""
    request = httpx.Request("POST", "http://x/", data=data, files=files)
    return request.read(), request.headers["content-type"]


def refused(raw: bytes, content_type: str | None = FORM) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        form_fields(raw, content_type)
    assert caught.value.status == 400
    return caught.value


def test_the_model_is_found_among_files() -> None:
    raw = form(upload("file", TRICKY), field("model", "whisper-tiny"), field("language", "en"))
    assert form_fields(raw, FORM) == {"model": "whisper-tiny"}


def test_a_body_encoded_by_a_real_client() -> None:
    raw, content_type = encoded(
        {"model": "flux", "prompt": "a red fox", "n": "1"},
        {"image": ("fox.png", TRICKY * 3, "image/png")},
    )
    assert form_fields(raw, content_type) == {"model": "flux"}


@pytest.mark.parametrize(
    ("value", "stream"),
    [("true", True), ("True", True), ("1", True), ("on", True), ("false", False), ("", False)],
)
def test_stream_is_read_as_the_backends_read_a_boolean(value: str, stream: bool) -> None:
    raw = form(field("model", "w"), upload("file", b"RIFF"), field("stream", value))
    assert form_fields(raw, FORM) == {"model": "w", "stream": stream}


def test_no_model_field_is_left_to_model_field() -> None:
    raw = form(upload("file", b"RIFF"), field("response_format", "text"))
    fields = form_fields(raw, FORM)
    assert fields == {}
    with pytest.raises(InvalidRequest) as caught:
        model_field(fields)
    assert caught.value.code == "missing_model"


def test_an_empty_model_is_left_to_model_field() -> None:
    fields = form_fields(form(field("model", "")), FORM)
    with pytest.raises(InvalidRequest) as caught:
        model_field(fields)
    assert caught.value.code == "invalid_model"


def test_a_model_with_a_filename_still_names_the_model() -> None:
    assert form_fields(form(upload("model", b"m1")), FORM) == {"model": "m1"}


def test_an_empty_form_has_no_fields() -> None:
    assert form_fields(f"--{BOUNDARY}--\r\n".encode(), FORM) == {}


def test_two_models_are_refused() -> None:
    error = refused(form(field("model", "a"), field("model", "b")))
    assert error.code == "invalid_model"
    assert error.param == "model"


def test_a_model_that_is_not_utf8_is_refused() -> None:
    assert refused(form(field("model", b"\xff\xfe"))).code == "invalid_model"


def test_content_type_names_are_case_insensitive() -> None:
    raw = form(field("model", "m"))
    assert form_fields(raw, f"Multipart/Form-Data; boundary={BOUNDARY}") == {"model": "m"}
    assert form_boundary(f'multipart/form-data; boundary="{BOUNDARY}"') == BOUNDARY.encode()


@pytest.mark.parametrize(
    "content_type",
    [None, "", "application/json", "multipart/mixed; boundary=x", "text/plain"],
)
def test_another_content_type_is_refused(content_type: str | None) -> None:
    assert refused(form(field("model", "m")), content_type).code == "invalid_content_type"


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b'{"model": "m"}', id="json"),
        pytest.param(form(field("model", "m"))[:-8], id="truncated"),
        pytest.param(field("model", "m"), id="no-closing-boundary"),
        pytest.param(b"--other\r\n" + form(field("model", "m")), id="wrong-boundary"),
        pytest.param(
            f"--{BOUNDARY}\r\nContent-Type: text/plain\r\n\r\nx\r\n--{BOUNDARY}--".encode(),
            id="no-content-disposition",
        ),
        pytest.param(
            f"--{BOUNDARY}\r\nContent-Disposition: attachment\r\n\r\nx\r\n--{BOUNDARY}--".encode(),
            id="not-form-data",
        ),
        pytest.param(
            f"--{BOUNDARY}\r\nBad Header: x\r\n\r\nx\r\n--{BOUNDARY}--".encode(),
            id="bad-header-name",
        ),
    ],
)
def test_a_malformed_form_is_refused(raw: bytes) -> None:
    assert refused(raw).code == "invalid_multipart"


def test_a_content_type_without_boundary_is_refused() -> None:
    assert refused(form(field("model", "m")), "multipart/form-data").code == "invalid_multipart"


def test_too_many_parts_are_refused() -> None:
    raw = form(field("model", "m"), *(field("x", "") for _ in range(MAX_PARTS)))
    assert "parts" in refused(raw).message


def test_oversized_part_headers_are_refused() -> None:
    raw = form(field("model", "m", "; pad=" + "x" * MAX_PART_HEADER_BYTES))
    assert "headers" in refused(raw).message


def test_the_threaded_reader_gives_the_same_answer() -> None:
    raw = form(field("model", "m"), upload("file", TRICKY))
    assert asyncio.run(read_form_fields(raw, FORM)) == {"model": "m"}


# --- fuzz -----------------------------------------------------------------------------


def outcome_of(raw: bytes, content_type: str) -> dict[str, Any] | InvalidRequest:
    """The fields found, or the refusal (never any other exception)."""
    try:
        return form_fields(raw, content_type)
    except InvalidRequest as error:
        return error


TEXT = st.text(st.characters(codec="utf-8"), max_size=40)
ONE_LINE = st.text(st.characters(codec="utf-8", exclude_characters="\r\n"), min_size=1)


@settings(max_examples=150, deadline=None)
@given(
    model=ONE_LINE,
    others=st.dictionaries(
        st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12).filter(
            lambda name: name not in ("model", "stream")
        ),
        TEXT,
        max_size=4,
    ),
    files=st.lists(st.binary(max_size=600), min_size=1, max_size=3),
)
def test_any_client_form_yields_its_model(
    model: str, others: dict[str, str], files: list[bytes]
) -> None:
    uploads = {f"image{i}": (f"{i}.png", data, "image/png") for i, data in enumerate(files)}
    raw, content_type = encoded({**others, "model": model}, uploads)
    assert form_fields(raw, content_type) == {"model": model}


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_escape_as_anything_but_400(raw: bytes) -> None:
    outcome = outcome_of(raw, FORM)
    if isinstance(outcome, InvalidRequest):
        assert outcome.status == 400
    else:
        assert set(outcome) <= {"model", "stream"}


@settings(max_examples=100, deadline=None)
@given(data=st.binary(max_size=200), cut=st.integers(min_value=1, max_value=30))
def test_a_form_cut_short_is_refused(data: bytes, cut: int) -> None:
    content = TRICKY + data
    assume(all(f"\r\n--{BOUNDARY}{end}".encode() not in content for end in ("--", "\r\n")))
    raw = form(field("model", "m"), upload("file", content))
    ending = len(f"--{BOUNDARY}--\r\n")
    assert refused(raw[: -(ending + cut - 3)]).code == "invalid_multipart"


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=60))
def test_arbitrary_content_types_are_refused_or_parsed(content_type: str) -> None:
    outcome = outcome_of(form(field("model", "m")), content_type)
    if isinstance(outcome, InvalidRequest):
        assert outcome.code in ("invalid_content_type", "invalid_multipart")
