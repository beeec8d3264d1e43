"""The request middleware in process: request ids in responses and log records, one
access line, one span and one metrics record per model request, and failures."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from slm_server.logging_setup import REQUEST_ID, RequestIdFilter
from slm_server.router.call.backend_state import StateView
from slm_server.router.call.exchange import exchange_of
from slm_server.router.dispatch.lookup import Registry
from slm_server.router.observe.metrics import Metrics
from slm_server.router.observe.observer import MAX_SHOWN, RequestObserver, request_id_from, shown
from slm_server.router.observe.telemetry import Telemetry
from slm_server.settings import TelemetrySettings
from tests.registry_entries import model_spec

ALPHA = model_spec("alpha", "alpha")
app_log = logging.getLogger("slm_server.test_handler")


async def chat(request: Request) -> JSONResponse:
    exchange = exchange_of(request.scope)
    exchange.note_request(await request.json())
    exchange.spec = ALPHA
    app_log.info("inside the handler")
    exchange.note_response({"id": "c1", "usage": {"prompt_tokens": 2, "completion_tokens": 3}})
    return JSONResponse({"ok": True, "upstream": exchange.upstream_headers})


async def broken(_request: Request) -> JSONResponse:
    raise KeyError("bug")


async def plain(_request: Request) -> JSONResponse:
    app_log.info("plain handler")
    return JSONResponse({"ok": True})


class Rig:
    def __init__(self, tmp_path: Path) -> None:
        self.memory = InMemorySpanExporter()
        settings = TelemetrySettings(True, "http://collector:4318", "svc", False)
        self.telemetry = Telemetry(settings, environ={}, exporter=self.memory)
        self.telemetry.start()
        self.metrics = Metrics(Registry([ALPHA]), StateView(tmp_path / "state.json"))
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", chat, methods=["POST"]),
                Route("/v1/embeddings", broken, methods=["POST"]),
                Route("/v1/models", plain, methods=["GET"]),
            ],
            middleware=[
                Middleware(RequestObserver, telemetry=self.telemetry, metrics=self.metrics)
            ],
        )

    def call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        async def go() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                return await client.request(method, path, **kwargs)

        return asyncio.run(go())

    def spans(self) -> list[Any]:
        assert self.telemetry.provider is not None
        self.telemetry.provider.force_flush()
        return list(self.memory.get_finished_spans())


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    made = Rig(tmp_path)
    yield made
    asyncio.run(made.telemetry.shutdown())


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="slm_server")
    caplog.handler.addFilter(RequestIdFilter())
    return caplog


def ours(logs: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in logs.records if r.name.startswith("slm_server.")]


def test_a_model_request_gets_an_id_a_span_metrics_and_one_access_line(
    rig: Rig, logs: pytest.LogCaptureFixture
) -> None:
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    response = rig.call(
        "POST",
        "/v1/chat/completions",
        json={"model": "alpha", "messages": []},
        headers={"x-request-id": "abc-123", "traceparent": parent},
    )
    assert response.status_code == 200
    assert response.headers["x-request-id"] == "abc-123"
    [span] = rig.spans()
    assert span.name == "chat alpha"
    assert (span.attributes or {})["slm.request_id"] == "abc-123"
    assert (span.attributes or {})["gen_ai.usage.output_tokens"] == 3
    assert response.json()["upstream"]["traceparent"].endswith(f"{span.context.span_id:016x}-01")
    labels = {"model": "alpha", "emit_path": "chat", "outcome": "ok", "status_class": "2xx"}
    assert rig.metrics.registry.get_sample_value("slm_requests_total", labels) == 1
    inside = [r for r in ours(logs) if r.name == "slm_server.test_handler"]
    assert [getattr(r, "request_id", None) for r in inside] == ["abc-123"]
    [access] = [r for r in ours(logs) if r.name == "slm_server.access"]
    assert access.getMessage().startswith("POST /v1/chat/completions 200 ")
    assert getattr(access, "request_id", None) == "abc-123"
    assert getattr(access, "model", None) == "alpha"
    assert getattr(access, "outcome", None) == "ok"
    assert REQUEST_ID.get() is None


def test_other_endpoints_get_an_id_and_a_log_line_but_no_span(
    rig: Rig, logs: pytest.LogCaptureFixture
) -> None:
    response = rig.call("GET", "/v1/models")
    generated = response.headers["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", generated)
    assert rig.spans() == []
    assert [getattr(r, "request_id", None) for r in ours(logs)] == [generated, generated]


def test_an_unexpected_error_is_a_500_span_and_a_router_error(
    rig: Rig, logs: pytest.LogCaptureFixture
) -> None:
    response = rig.call("POST", "/v1/embeddings", json={})
    assert response.status_code == 500
    [span] = rig.spans()
    assert (span.attributes or {})["error.type"] == "KeyError"
    labels = {"model": "unknown", "emit_path": "embeddings", "outcome": "router_error"}
    sample = rig.metrics.registry.get_sample_value
    assert sample("slm_requests_total", {**labels, "status_class": "5xx"}) == 1
    [access] = [r for r in ours(logs) if r.name == "slm_server.access"]
    assert getattr(access, "status", None) == 500
    assert rig.metrics.live == {}
    # One traceback, carrying the id the client was given with its OpenAI-shaped 500.
    request_id = response.headers["x-request-id"]
    [failure] = [r for r in ours(logs) if r.levelno >= logging.ERROR]
    assert failure.getMessage() == f"request {request_id} failed unexpectedly"
    assert failure.exc_info is not None and isinstance(failure.exc_info[1], KeyError)
    assert response.json()["error"]["code"] == "internal_error"


def test_an_unprintable_model_cannot_forge_a_log_line(
    rig: Rig, logs: pytest.LogCaptureFixture
) -> None:
    rig.call("POST", "/v1/embeddings", json={})
    rig.call("POST", "/v1/chat/completions", content=b'{"model": "a\\nINFO fake line"}')
    messages = [r.getMessage() for r in ours(logs) if r.name == "slm_server.access"]
    assert all("\n" not in m for m in messages)


def test_a_path_with_crlf_cannot_forge_a_log_line(rig: Rig, logs: pytest.LogCaptureFixture) -> None:
    rig.call("GET", "/v1/x%0d%0aINFO%20slm_server.access%20GET%20/forged%20200")
    [access] = [r for r in ours(logs) if r.name == "slm_server.access"]
    message = access.getMessage()
    assert "\r" not in message and "\n" not in message
    assert "/v1/x\\r\\nINFO slm_server.access GET /forged 200" in message
    assert "\n" not in str(getattr(access, "path", ""))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("/v1/models", "/v1/models"),
        ("/a\r\nb", "/a\\r\\nb"),
        ("m\x00\x1b[31m", "m\\x00\\x1b[31m"),
        ("x" * 500, "x" * MAX_SHOWN),
        ("caf\u00e9 \u65e5", "caf\u00e9 \u65e5"),
        ("\u2028", "\\u2028"),
    ],
)
def test_shown(text: str, expected: str) -> None:
    assert shown(text) == expected


@given(st.binary(max_size=200))
def test_request_ids_are_the_clients_only_when_short_printable_tokens(raw: bytes) -> None:
    chosen = request_id_from(raw)
    acceptable = re.fullmatch(rb"[A-Za-z0-9._:@/+=-]{1,128}", raw) is not None
    assert chosen == (raw.decode() if acceptable else chosen)
    if not acceptable:
        assert re.fullmatch(r"[0-9a-f]{32}", chosen)
    assert chosen.isascii() and chosen.isprintable() and " " not in chosen


def test_a_missing_request_id_is_made() -> None:
    assert re.fullmatch(r"[0-9a-f]{32}", request_id_from(None))
