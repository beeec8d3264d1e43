"""The gateway's error classes and their HTTP and SSE renderings."""

from __future__ import annotations

import json

import pytest

from slm_server.errors import (
    AmbiguousModel,
    BackendProtocolError,
    BackendTimeout,
    BackendUnavailable,
    GatewayError,
    InvalidRequest,
    ModelNotFound,
    UnsupportedEndpoint,
)

CLASSES: list[tuple[type[GatewayError], int, str, str]] = [
    (GatewayError, 500, "server_error", "internal_error"),
    (InvalidRequest, 400, "invalid_request_error", "invalid_request"),
    (UnsupportedEndpoint, 400, "invalid_request_error", "unsupported_endpoint"),
    (ModelNotFound, 404, "invalid_request_error", "model_not_found"),
    (AmbiguousModel, 409, "invalid_request_error", "ambiguous_model"),
    (BackendUnavailable, 503, "backend_unavailable", "backend_unreachable"),
    (BackendTimeout, 504, "timeout_error", "backend_timeout"),
    (BackendProtocolError, 502, "backend_error", "bad_backend_response"),
]


@pytest.mark.parametrize(("cls", "status", "error_type", "code"), CLASSES)
def test_status_and_body(cls: type[GatewayError], status: int, error_type: str, code: str) -> None:
    error = cls("something went wrong")
    assert isinstance(error, GatewayError)
    assert isinstance(error, Exception)
    assert error.status == status
    assert str(error) == "something went wrong"
    assert error.body() == {
        "error": {
            "message": "something went wrong",
            "type": error_type,
            "code": code,
            "param": None,
        }
    }
    assert error.headers() == {}


@pytest.mark.parametrize(("cls", "status", "error_type", "code"), CLASSES)
def test_given_code_and_param(
    cls: type[GatewayError], status: int, error_type: str, code: str
) -> None:
    error = cls("bad", code="custom_code", param="model")
    assert error.code == "custom_code"
    assert error.body()["error"] == {
        "message": "bad",
        "type": error_type,
        "code": "custom_code",
        "param": "model",
    }
    assert error.status == status


def test_unsupported_endpoint_is_an_invalid_request() -> None:
    assert issubclass(UnsupportedEndpoint, InvalidRequest)
    assert not issubclass(ModelNotFound, InvalidRequest)


def test_builtin_exceptions_are_not_gateway_errors() -> None:
    for builtin in (ValueError, KeyError, TimeoutError, ConnectionError):
        assert not issubclass(builtin, GatewayError)


@pytest.mark.parametrize(
    ("retry_after", "header"),
    [
        (0.0, "1"),
        (0.2, "1"),
        (0.9, "1"),
        (1.0, "1"),
        (1.4, "2"),
        (2.6, "3"),
        (30.0, "30"),
        (59.9, "60"),
    ],
)
def test_retry_after_header(retry_after: float, header: str) -> None:
    error = BackendUnavailable("loading", retry_after=retry_after)
    assert error.headers() == {"Retry-After": header}
    assert error.retry_after == retry_after
    assert "retry" not in json.dumps(error.body()).lower()


@pytest.mark.parametrize(("cls", "status", "error_type", "code"), CLASSES)
def test_sse_event(cls: type[GatewayError], status: int, error_type: str, code: str) -> None:
    error = cls('line one\nline "two"', param="x")
    event = error.sse_event()
    assert isinstance(event, bytes)
    assert event.startswith(b"data: ")
    assert event.endswith(b"\n\n")
    payload = event[len(b"data: ") : -2]
    assert b"\n" not in payload
    assert json.loads(payload) == error.body()
    assert json.loads(payload)["error"]["code"] == code


def test_sse_event_non_ascii() -> None:
    event = BackendTimeout("délai dépassé ✓").sse_event()
    assert json.loads(event[6:-2])["error"]["message"] == "délai dépassé ✓"
