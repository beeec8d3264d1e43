"""The router's own OTLP/HTTP exporter against a real receiver: it sends the bytes and
the headers the SDK's exporter sends, retries a busy collector, gives up within its
timeout without holding up the router, and stops at shutdown."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from slm_server.router.apis.table import TABLE
from slm_server.router.call.exchange import Exchange
from slm_server.router.observe.otlp_export import ExportConfig, OtlpHttpExporter
from slm_server.router.observe.telemetry import UNIQUE_ATTRIBUTES, Inbound, Telemetry
from slm_server.settings import TelemetrySettings
from tests.integration.otlp_receiver import OtlpReceiver
from tests.registry_entries import model_spec

CHAT_PATH = "/v1/chat/completions"

RESOURCE = Resource.create({"service.name": "slm-server", "service.version": "1.0"})
SCOPE = InstrumentationScope("slm_server", "1.0")
# Headers either HTTP client adds on its own (and the one that names the port).
TRANSPORT_HEADERS = {"host", "content-length", "accept", "accept-encoding", "connection"}


def chat_span(n: int, **attributes: Any) -> ReadableSpan:
    """A span as the router makes one for a chat completion."""
    trace_id = uuid.uuid4().int
    values: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "slm.emit_path": "streaming" if n % 2 else "chat",
        "slm.request_id": uuid.uuid4().hex,
        "gen_ai.request.stream": bool(n % 2),
        "gen_ai.provider.name": "llama.cpp",
        "server.address": "127.0.0.1",
        "server.port": 8501,
        "gen_ai.request.model": "smollm2-135m-instruct",
        "gen_ai.response.model": "smollm2-135m-instruct",
        "gen_ai.request.max_tokens": 64,
        "gen_ai.request.temperature": 0.7,
        "gen_ai.response.id": f"chatcmpl-{uuid.uuid4().hex}",
        "gen_ai.usage.input_tokens": 20 + n,
        "gen_ai.usage.output_tokens": n,
        "gen_ai.response.finish_reasons": ("stop",),
        "http.response.status_code": 200,
        **attributes,
    }
    return ReadableSpan(
        name="chat smollm2-135m-instruct",
        context=SpanContext(trace_id, n + 1, is_remote=False, trace_flags=TraceFlags(1)),
        parent=SpanContext(trace_id, 0xB7AD6B7169203331, is_remote=True),
        resource=RESOURCE,
        attributes=values,
        events=(Event("exception", {"exception.type": "KeyError"}, timestamp=5),) if n == 3 else (),
        kind=SpanKind.CLIENT,
        status=Status(StatusCode.ERROR) if n == 3 else Status(StatusCode.UNSET),
        start_time=1_700_000_000_000_000_000 + n,
        end_time=1_700_000_000_100_000_000 + n,
        instrumentation_scope=SCOPE,
    )


def sdk_bytes(spans: list[ReadableSpan]) -> bytes:
    data: bytes = encode_spans(spans).SerializePartialToString()
    return data


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as running:
        yield running


def ours(
    receiver: OtlpReceiver, timeout: float = 5.0, environ: dict[str, str] | None = None
) -> OtlpHttpExporter:
    config = ExportConfig.from_environ(f"{receiver.url}/v1/traces", environ or {}, timeout)
    return OtlpHttpExporter(config, UNIQUE_ATTRIBUTES)


def exported(exporter: OtlpHttpExporter, spans: list[ReadableSpan]) -> tuple[Any, float]:
    """What ``export`` returned, and how long it took."""
    started = time.monotonic()
    result = exporter.export(spans)
    return result, time.monotonic() - started


def test_the_bytes_and_headers_are_those_of_the_sdks_exporter(receiver: OtlpReceiver) -> None:
    spans = [chat_span(n) for n in range(40)]
    environ = {"OTEL_EXPORTER_OTLP_TRACES_HEADERS": "api-key=s3cret,X-Tenant=team%201"}
    exporter = ours(receiver, environ=environ)
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    with pytest.MonkeyPatch.context() as env:
        for name, value in environ.items():
            env.setenv(name, value)
        sdk = OTLPSpanExporter(endpoint=f"{receiver.url}/v1/traces", timeout=5)
    assert sdk.export(spans) is SpanExportResult.SUCCESS
    stop_sdk: Callable[[], None] = sdk.shutdown  # untyped in the SDK
    stop_sdk()
    exporter.shutdown()
    mine, theirs = receiver.received.bodies
    assert mine == theirs == sdk_bytes(spans)
    got = [s for s in receiver.spans()]
    assert got[:40] == got[40:]
    assert [s.attributes["slm.request_id"] for s in got[:40]] == [
        (s.attributes or {})["slm.request_id"] for s in spans
    ]
    assert got[3].events == ("exception",)
    mine_headers, their_headers = (
        {k: v for k, v in h.items() if k not in TRANSPORT_HEADERS}
        for h in receiver.received.headers
    )
    assert mine_headers == their_headers
    assert mine_headers["content-type"] == "application/x-protobuf"
    assert mine_headers["api-key"] == "s3cret"
    assert mine_headers["x-tenant"] == "team 1"


def test_a_batch_the_compact_encoder_cannot_write_goes_out_in_the_sdks_bytes(
    receiver: OtlpReceiver,
) -> None:
    """A nested attribute value is beyond the compact encoder: the batch is encoded by the
    SDK's public encoder instead (imported only then), not dropped."""
    spans = [chat_span(0), chat_span(1, nested={"a": 1})]
    exporter = ours(receiver)
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    exporter.shutdown()
    assert receiver.received.bodies == [sdk_bytes(spans)]


@pytest.mark.parametrize("compression", ["gzip", "deflate"])
def test_compression_from_the_environment(receiver: OtlpReceiver, compression: str) -> None:
    spans = [chat_span(n) for n in range(5)]
    exporter = ours(receiver, environ={"OTEL_EXPORTER_OTLP_COMPRESSION": compression})
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    assert receiver.received.headers[0]["content-encoding"] == compression
    assert receiver.received.bodies == [sdk_bytes(spans)]  # as the receiver decompressed it
    exporter.shutdown()


def test_a_batch_the_compact_encoder_cannot_write_goes_out_in_the_sdks_encoding(
    receiver: OtlpReceiver,
) -> None:
    spans = [chat_span(1), chat_span(2, raw=b"bytes")]
    exporter = ours(receiver)
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    assert receiver.received.bodies == [sdk_bytes(spans)]
    assert len(receiver.spans()) == 2
    exporter.shutdown()


def test_a_503_is_retried_after_a_back_off_then_the_batch_arrives() -> None:
    with OtlpReceiver(script=[503]) as receiver:
        exporter = ours(receiver)
        result, took = exported(exporter, [chat_span(1)])
        exporter.shutdown()
    assert result is SpanExportResult.SUCCESS
    assert receiver.received.posts == 2
    assert len(receiver.spans()) == 1
    assert 0.8 <= took < 3  # one back-off of 1 s ± 20 %


@pytest.mark.parametrize("status", [429, 502, 503, 504])
def test_retry_after_sets_the_back_off(status: int) -> None:
    with OtlpReceiver(script=[status, status], retry_after="0") as receiver:
        exporter = ours(receiver)
        result, took = exported(exporter, [chat_span(1)])
        exporter.shutdown()
    assert result is SpanExportResult.SUCCESS
    assert receiver.received.posts == 3
    assert took < 0.7  # no back-off of its own (0.8 s at least)


def test_a_status_not_worth_retrying_fails_at_once(caplog: pytest.LogCaptureFixture) -> None:
    with OtlpReceiver(status=400) as receiver:
        exporter = ours(receiver)
        with caplog.at_level(logging.ERROR, logger="slm_server.telemetry.export"):
            result, took = exported(exporter, [chat_span(1)])
        exporter.shutdown()
    assert result is SpanExportResult.FAILURE
    assert receiver.received.posts == 1
    assert took < 0.7
    assert "code: 400" in caplog.text


def test_a_busy_collector_is_given_up_on_within_the_timeout() -> None:
    with OtlpReceiver(status=503) as receiver:
        exporter = ours(receiver, timeout=1.5)
        result, took = exported(exporter, [chat_span(1)])
        exporter.shutdown()
    assert result is SpanExportResult.FAILURE
    # At once, then after 0.8 to 1.2 s; the next back-off (1.6 to 2.4 s) is past the timeout.
    assert receiver.received.posts == 2
    assert 0.8 <= took <= 1.5


def test_a_collector_that_never_answers_is_given_up_on_at_the_timeout() -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:  # listens, never answers
        port = silent.getsockname()[1]
        config = ExportConfig(f"http://127.0.0.1:{port}/v1/traces", timeout=0.5)
        exporter = OtlpHttpExporter(config)
        result, took = exported(exporter, [chat_span(1)])
        exporter.shutdown()
    assert result is SpanExportResult.FAILURE
    assert 0.4 <= took < 1.5


def test_shutdown_ends_a_back_off_at_once() -> None:
    with OtlpReceiver(status=503, retry_after="30") as receiver:
        exporter = ours(receiver, timeout=60)
        outcome: list[tuple[Any, float]] = []
        worker = threading.Thread(target=lambda: outcome.append(exported(exporter, [chat_span(1)])))
        waiting = threading.Event()
        handler = logging.Handler()
        handler.emit = lambda record: waiting.set() if "retry in" in record.getMessage() else None  # type: ignore[method-assign]
        logger = logging.getLogger("slm_server.telemetry.export")
        logger.addHandler(handler)
        try:
            worker.start()
            assert waiting.wait(10)  # the exporter is in its 30 s back-off
        finally:
            logger.removeHandler(handler)
        exporter.shutdown()
        worker.join(5)
        assert not worker.is_alive()
        [(result, took)] = outcome
        assert result is SpanExportResult.FAILURE
        assert took < 5
        # Nothing is sent after shutdown.
        assert exporter.export([chat_span(2)]) is SpanExportResult.FAILURE
        exporter.shutdown()  # a second time: nothing happens
    assert receiver.received.posts == 1


def test_a_batch_over_the_size_limit_is_dropped(
    receiver: OtlpReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    config = ExportConfig(f"{receiver.url}/v1/traces", max_request_bytes=1000)
    exporter = OtlpHttpExporter(config)
    with caplog.at_level(logging.WARNING, logger="slm_server.telemetry.export"):
        assert exporter.export([chat_span(n) for n in range(10)]) is SpanExportResult.FAILURE
    assert "over the 1000-byte limit" in caplog.text
    assert exporter.export([chat_span(1)]) is SpanExportResult.SUCCESS
    assert receiver.received.posts == 1
    exporter.shutdown()


def routed() -> Exchange:
    exchange = Exchange(
        request_id=uuid.uuid4().hex, method="POST", path=CHAT_PATH, shape=TABLE.at(CHAT_PATH)
    )
    exchange.note_request({"model": "alpha"})
    exchange.spec = model_spec("alpha", "alpha")
    exchange.status = 200
    return exchange


def test_requests_are_not_held_up_while_an_export_is_retried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The router's own telemetry, built with its exporter, against a collector that is
    always busy: spans are still made at once while a batch waits out its back-off, and
    shutdown stays bounded."""
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "10")
    with OtlpReceiver(status=503) as receiver:
        settings = TelemetrySettings(
            enabled=True, otlp_endpoint=receiver.url, service_name="svc", log_json=False
        )
        telemetry = Telemetry(settings, environ={})
        telemetry.start()
        assert isinstance(telemetry.effective_config(), dict)

        def one() -> None:
            exchange = routed()
            span = telemetry.open_span(exchange, Inbound())
            assert span is not None
            telemetry.close_span(span, exchange)

        one()
        receiver.wait_for_posts(1)  # the first batch is being retried from now on
        started = time.monotonic()
        for _ in range(200):
            one()
        assert time.monotonic() - started < 0.5
        assert receiver.received.posts == 1  # still within the first back-off
        started = time.monotonic()
        asyncio.run(telemetry.shutdown(timeout=1.0))
        assert time.monotonic() - started < 2
    assert receiver.spans() == []
