"""Spans from exchanges, trace continuation, the export-warning limiter, disabling,
and a shutdown that stays bounded when the exporter hangs."""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext, SpanKind, StatusCode

from slm_server.registry.schema import ModelSpec
from slm_server.router.apis.table import TABLE
from slm_server.router.call.exchange import Exchange
from slm_server.router.observe.otlp_export import OtlpHttpExporter
from slm_server.router.observe.telemetry import (
    EMIT_SITES,
    ExportWarnings,
    Inbound,
    Telemetry,
    error_type,
    samples_every_root,
    span_attributes,
)
from slm_server.settings import TelemetrySettings
from tests.registry_entries import model_spec

PARENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
PARENT_SPAN = "b7ad6b7169203331"
TRACEPARENT = f"00-{PARENT_TRACE}-{PARENT_SPAN}-01"
TelemetrySpanContext = SpanContext(int(PARENT_TRACE, 16), int(PARENT_SPAN, 16), is_remote=False)


def spec(model_id: str = "alpha", backend: str = "llamacpp", **fields: Any) -> ModelSpec:
    return model_spec("role", model_id, backend=backend, **{"host": "127.0.0.2", **fields})


def settings(**fields: Any) -> TelemetrySettings:
    values: dict[str, Any] = {
        "enabled": True,
        "otlp_endpoint": "http://collector:4318",
        "service_name": "svc",
        "log_json": False,
    }
    values.update(fields)
    return TelemetrySettings(**values)


def served(path: str = "/v1/chat/completions", **request: Any) -> Exchange:
    exchange = Exchange(request_id="rid-1", method="POST", path=path, shape=TABLE.at(path))
    exchange.note_request({"model": "alpha", **request})
    exchange.spec = spec()
    return exchange


@pytest.fixture
def memory() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def telemetry(memory: InMemorySpanExporter) -> Iterator[Telemetry]:
    running = Telemetry(settings(), environ={}, exporter=memory)
    running.start()
    yield running
    asyncio.run(running.shutdown())


def finished(telemetry: Telemetry, memory: InMemorySpanExporter) -> ReadableSpan:
    assert telemetry.provider is not None
    telemetry.provider.force_flush()
    [span] = memory.get_finished_spans()
    return span


def test_a_chat_span_carries_the_genai_attributes(
    telemetry: Telemetry, memory: InMemorySpanExporter
) -> None:
    exchange = served(max_tokens=12, temperature=0.2, top_p=1, stream=False)
    span = telemetry.open_span(exchange, Inbound(traceparent=TRACEPARENT))
    assert span is not None
    exchange.status = 200
    exchange.note_response(
        {
            "id": "chatcmpl-1",
            "model": "alpha-q4",
            "choices": [{"finish_reason": "stop"}, {"finish_reason": "length"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 9},
        }
    )
    telemetry.close_span(span, exchange)
    done = finished(telemetry, memory)
    assert done.name == "chat alpha"
    assert done.kind is SpanKind.CLIENT
    assert done.status.status_code is StatusCode.UNSET
    assert done.parent is not None
    assert f"{done.parent.span_id:016x}" == PARENT_SPAN
    assert f"{done.context.trace_id:032x}" == PARENT_TRACE
    assert dict(done.attributes or {}) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "llama.cpp",
        "gen_ai.request.model": "alpha",
        "gen_ai.response.model": "alpha-q4",
        "gen_ai.request.max_tokens": 12,
        "gen_ai.request.temperature": 0.2,
        "gen_ai.request.top_p": 1.0,
        "gen_ai.request.stream": False,
        "gen_ai.response.id": "chatcmpl-1",
        "gen_ai.response.finish_reasons": ("stop", "length"),
        "gen_ai.usage.input_tokens": 5,
        "gen_ai.usage.output_tokens": 9,
        "server.address": "127.0.0.2",
        "server.port": 8501,
        "http.response.status_code": 200,
        "slm.emit_path": "chat",
        "slm.request_id": "rid-1",
    }
    resource = done.resource.attributes
    assert resource["service.name"] == "svc"
    # The context sent upstream names this span as the parent.
    expected = f"00-{PARENT_TRACE}-{done.context.span_id:016x}-01"
    assert exchange.upstream_headers == {"traceparent": expected}


def test_tracestate_is_continued(telemetry: Telemetry) -> None:
    exchange = served()
    span = telemetry.open_span(exchange, Inbound(TRACEPARENT, tracestate="vendor=abc"))
    assert span is not None
    assert exchange.upstream_headers["tracestate"] == "vendor=abc"
    telemetry.close_span(span, exchange)


def test_a_stream_reports_its_first_chunk(
    telemetry: Telemetry, memory: InMemorySpanExporter
) -> None:
    exchange = served(stream=True)
    span = telemetry.open_span(exchange, Inbound())
    assert span is not None
    exchange.first_chunk = exchange.started + 0.25
    exchange.status = 200
    telemetry.close_span(span, exchange)
    attributes = finished(telemetry, memory).attributes or {}
    assert attributes["gen_ai.response.time_to_first_chunk"] == pytest.approx(0.25)
    assert attributes["slm.emit_path"] == "streaming"
    assert attributes["gen_ai.request.stream"] is True


@pytest.mark.parametrize("traceparent", [None, "00-nonsense", f"00-{'0' * 32}-{PARENT_SPAN}-01"])
def test_without_a_valid_traceparent_a_root_span_keeps_the_legacy_id(
    telemetry: Telemetry, memory: InMemorySpanExporter, traceparent: str | None
) -> None:
    exchange = served()
    span = telemetry.open_span(exchange, Inbound(traceparent, legacy_trace_id="turn-7"))
    assert span is not None
    telemetry.close_span(span, exchange)
    done = finished(telemetry, memory)
    assert done.parent is None
    assert (done.attributes or {})["slm.client.trace_id"] == "turn-7"


def test_a_valid_traceparent_wins_over_the_legacy_id(
    telemetry: Telemetry, memory: InMemorySpanExporter
) -> None:
    exchange = served()
    span = telemetry.open_span(exchange, Inbound(TRACEPARENT, legacy_trace_id="turn-7"))
    assert span is not None
    telemetry.close_span(span, exchange)
    assert "slm.client.trace_id" not in (finished(telemetry, memory).attributes or {})


def test_an_unrouted_request_is_named_by_its_operation_only(
    telemetry: Telemetry, memory: InMemorySpanExporter
) -> None:
    exchange = Exchange(
        request_id="r", method="POST", path="/v1/embeddings", shape=TABLE.at("/v1/embeddings")
    )
    exchange.note_request({"model": "no-such-model"})
    span = telemetry.open_span(exchange, Inbound())
    assert span is not None
    exchange.status = 404
    exchange.error_type = "model_not_found"
    telemetry.close_span(span, exchange)
    done = finished(telemetry, memory)
    assert done.name == "embeddings"
    assert done.status.status_code is StatusCode.ERROR
    attributes = done.attributes or {}
    assert attributes["error.type"] == "model_not_found"
    assert attributes["gen_ai.request.model"] == "no-such-model"
    assert "gen_ai.provider.name" not in attributes


def test_an_exception_is_recorded_on_the_span(
    telemetry: Telemetry, memory: InMemorySpanExporter
) -> None:
    exchange = served()
    span = telemetry.open_span(exchange, Inbound())
    assert span is not None
    exchange.status = 500
    telemetry.close_span(span, exchange, KeyError("x"))
    done = finished(telemetry, memory)
    assert (done.attributes or {})["error.type"] == "KeyError"
    assert [event.name for event in done.events] == ["exception"]


@pytest.mark.parametrize(
    ("status", "code", "disconnected", "expected"),
    [
        (200, None, False, None),
        (200, "backend_stream_error", False, "backend_stream_error"),
        (503, None, False, "503"),
        (429, "queue_full", False, "queue_full"),
        (None, None, True, "cancelled"),
        (200, None, True, "cancelled"),
    ],
)
def test_error_type(
    status: int | None, code: str | None, disconnected: bool, expected: str | None
) -> None:
    exchange = served()
    exchange.status, exchange.error_type, exchange.disconnected = status, code, disconnected
    assert error_type(exchange) == expected


def test_mlx_backends_name_their_provider() -> None:
    exchange = served()
    exchange.spec = spec(backend="mlx", chat_template_kwargs=None)
    assert span_attributes(exchange)["gen_ai.provider.name"] == "mlx"


def test_a_long_model_name_is_cut() -> None:
    exchange = served()
    exchange.model = "m" * 1000
    assert len(span_attributes(exchange)["gen_ai.request.model"]) == 256


@pytest.mark.parametrize(
    ("fields", "environ"),
    [
        ({"enabled": False}, {}),
        ({}, {"OTEL_SDK_DISABLED": "true"}),
        ({}, {"OTEL_TRACES_EXPORTER": "none"}),
    ],
)
def test_disabled_telemetry_makes_no_spans(fields: dict[str, Any], environ: dict[str, str]) -> None:
    telemetry = Telemetry(settings(**fields), environ=environ, exporter=InMemorySpanExporter())
    telemetry.start()
    exchange = served()
    assert telemetry.open_span(exchange, Inbound(TRACEPARENT)) is None
    assert exchange.upstream_headers == {}
    config = telemetry.effective_config()
    assert config["telemetry_enabled"] is False
    assert config["tracer_provider_initialised"] is False


def test_effective_config_follows_the_live_provider(telemetry: Telemetry) -> None:
    assert telemetry.effective_config() == {
        "service_name": "svc",
        "otlp_endpoint": "http://collector:4318",
        "otlp_traces_endpoint": "http://collector:4318/v1/traces",
        "otlp_protocol": "http/protobuf",
        "telemetry_enabled": True,
        "tracer_provider_initialised": True,
        "emit_paths": list(EMIT_SITES),
    }
    asyncio.run(telemetry.shutdown())
    assert telemetry.effective_config()["tracer_provider_initialised"] is False


def test_the_exporter_timeout_is_short_unless_the_environment_says_otherwise() -> None:
    assert Telemetry(settings(), environ={}).export_timeout == 3.0
    custom = {"OTEL_EXPORTER_OTLP_TIMEOUT": "20"}
    assert Telemetry(settings(), environ=custom).export_timeout is None


def record(level: int = logging.ERROR, message: str = "Failed to export") -> logging.LogRecord:
    return logging.LogRecord("otel", level, __file__, 1, message, None, None)


def test_export_warnings_let_one_through_per_interval() -> None:
    now = [100.0]
    limiter = ExportWarnings("http://c/v1/traces", interval=60, clock=lambda: now[0])
    first = record()
    assert limiter.filter(first)
    assert first.levelname == "WARNING"
    assert first.getMessage().startswith("trace export to http://c/v1/traces is failing (")
    assert "Failed to export" in first.getMessage()
    now[0] += 30
    assert not limiter.filter(record())
    assert not limiter.filter(record(logging.WARNING))
    assert limiter.filter(record(logging.INFO, "not a complaint"))
    now[0] += 31
    later = record()
    assert limiter.filter(later)
    assert "2 similar message(s) suppressed" in later.getMessage()


def test_export_warnings_drop_tracebacks() -> None:
    limiter = ExportWarnings("e", clock=lambda: 0.0)
    try:
        raise ConnectionError("refused")
    except ConnectionError:
        failing = logging.LogRecord(
            "otel", logging.ERROR, __file__, 1, "boom", None, sys.exc_info()
        )
    assert limiter.filter(failing)
    assert failing.exc_info is None
    assert "ConnectionError('refused')" in failing.getMessage()


class HangingExporter(SpanExporter):
    """An exporter stuck on a dead collector until it is shut down."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.exporting = threading.Event()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.exporting.set()
        self.stop.wait(30)
        return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        self.stop.set()


def test_shutdown_is_bounded_when_the_export_hangs() -> None:
    exporter = HangingExporter()
    telemetry = Telemetry(settings(), environ={}, exporter=exporter)
    telemetry.start()
    exchange = served()
    span = telemetry.open_span(exchange, Inbound())
    assert span is not None
    telemetry.close_span(span, exchange)
    assert telemetry.provider is not None
    threading.Thread(target=telemetry.provider.force_flush, daemon=True).start()
    assert exporter.exporting.wait(5)
    started = time.monotonic()
    asyncio.run(telemetry.shutdown(timeout=0.2))
    assert time.monotonic() - started < 2
    assert exporter.stop.is_set()
    assert telemetry.open_span(served(), Inbound()) is None


def test_a_long_cause_is_cut() -> None:
    long = record(message="x" * 5000)
    assert ExportWarnings("e", clock=lambda: 0.0).filter(long)
    assert len(long.getMessage()) < 500


def test_an_exporter_that_cannot_be_built_leaves_traces_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    environ = {"OTEL_EXPORTER_OTLP_CERTIFICATE": "/no/such/ca.pem"}
    telemetry = Telemetry(settings(otlp_endpoint="https://collector:4318"), environ=environ)
    with caplog.at_level(logging.WARNING, logger="slm_server.telemetry"):
        telemetry.start()
    assert telemetry.open_span(served(), Inbound()) is None
    assert telemetry.effective_config()["tracer_provider_initialised"] is False
    assert "traces are off" in caplog.text


@pytest.mark.parametrize(
    ("sampler", "inbound", "flags", "exported"),
    [
        ("always_on", None, "03", True),
        ("always_off", None, "02", False),
        ("always_off", TRACEPARENT, "00", False),
        ("parentbased_always_on", TRACEPARENT, "01", True),
        ("parentbased_always_on", TRACEPARENT[:-2] + "00", "00", False),
    ],
)
def test_the_configured_sampler_decides_as_in_the_sdk(
    monkeypatch: pytest.MonkeyPatch,
    sampler: str,
    inbound: str | None,
    flags: str,
    exported: bool,
) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", sampler)
    memory = InMemorySpanExporter()
    telemetry = Telemetry(settings(), environ={}, exporter=memory)
    telemetry.start()
    exchange = served()
    span = telemetry.open_span(exchange, Inbound(inbound, tracestate="v=1"))
    assert span is not None
    telemetry.close_span(span, exchange)
    assert exchange.upstream_headers["traceparent"].endswith(f"-{flags}")
    if inbound is not None:
        assert exchange.upstream_headers["tracestate"] == "v=1"
    assert telemetry.provider is not None
    telemetry.provider.force_flush()
    assert len(memory.get_finished_spans()) == (1 if exported else 0)
    asyncio.run(telemetry.shutdown())


@pytest.mark.parametrize(
    ("sampler", "every_root"),
    [
        (None, True),
        ("always_on", True),
        ("parentbased_always_on", True),
        ("always_off", False),
        ("parentbased_always_off", False),
        ("traceidratio", False),
        ("parentbased_traceidratio", False),
    ],
)
def test_a_root_span_is_sampled_as_the_sdks_sampler_would(
    monkeypatch: pytest.MonkeyPatch, sampler: str | None, every_root: bool
) -> None:
    """Where the sampler is known to sample every root span the router decides without
    asking it, and the span and its headers are those the sampler's answer makes."""
    if sampler is not None:
        monkeypatch.setenv("OTEL_TRACES_SAMPLER", sampler)
        monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.5")
    made: list[tuple[Any, ...]] = []
    for ask in (False, True):
        memory = InMemorySpanExporter()
        telemetry = Telemetry(settings(), environ={}, exporter=memory)
        telemetry.start()
        assert telemetry.provider is not None
        assert samples_every_root(telemetry.provider.sampler) is every_root
        if ask:  # the sampler asked, always
            telemetry._every_root = False
        ids = iter(range(1, 1000))
        monkeypatch.setattr(telemetry._ids, "generate_trace_id", lambda ids=ids: next(ids) << 64)
        monkeypatch.setattr(telemetry._ids, "generate_span_id", lambda ids=ids: next(ids))
        exchange = served()
        span = telemetry.open_span(exchange, Inbound(legacy_trace_id="legacy-1"))
        assert span is not None
        telemetry.close_span(span, exchange)
        telemetry.provider.force_flush()
        spans = [
            (s.context, s.parent, dict(s.attributes or {})) for s in memory.get_finished_spans()
        ]
        made.append((dict(exchange.upstream_headers), span.recording, spans))
        asyncio.run(telemetry.shutdown())
    assert made[0] == made[1]


def test_the_exception_event_is_the_sdks(
    telemetry: Telemetry, memory: InMemorySpanExporter
) -> None:
    try:
        raise KeyError("x")
    except KeyError as caught:
        error = caught
    exchange = served()
    span = telemetry.open_span(exchange, Inbound())
    assert span is not None
    telemetry.close_span(span, exchange, error)
    sdk_span = TracerProvider().get_tracer("t").start_span("s")
    sdk_span.record_exception(error)
    sdk_span.end()
    [ours] = finished(telemetry, memory).events
    [theirs] = sdk_span.events  # type: ignore[attr-defined]
    assert ours.name == theirs.name == "exception"
    assert dict(ours.attributes or {}) == dict(theirs.attributes)


def test_span_limits_from_the_environment_apply(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "5")
    memory = InMemorySpanExporter()
    telemetry = Telemetry(settings(), environ={}, exporter=memory)
    telemetry.start()
    exchange = served()
    span = telemetry.open_span(exchange, Inbound())
    assert span is not None
    telemetry.close_span(span, exchange)
    attributes = finished(telemetry, memory).attributes or {}
    assert attributes["slm.request_id"] == "rid-1"
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["slm.emit_path"] == "chat"
    assert attributes["gen_ai.provider.name"] == "llama"
    asyncio.run(telemetry.shutdown())


def test_a_telemetry_without_an_exporter_given_builds_the_routers_own() -> None:
    telemetry = Telemetry(settings(), environ={"OTEL_EXPORTER_OTLP_HEADERS": "k=v"})
    telemetry.start()
    exporter = telemetry._exporter
    assert isinstance(exporter, OtlpHttpExporter)
    assert exporter.config.endpoint == "http://collector:4318/v1/traces"
    assert exporter.config.timeout == 3.0
    assert exporter.config.headers["k"] == "v"
    asyncio.run(telemetry.shutdown(timeout=0.5))


def test_the_exporters_timeout_comes_from_the_environment_when_set() -> None:
    telemetry = Telemetry(settings(), environ={"OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "7.5"})
    telemetry.start()
    assert isinstance(telemetry._exporter, OtlpHttpExporter)
    assert telemetry._exporter.config.timeout == 7.5
    asyncio.run(telemetry.shutdown(timeout=0.5))


def test_an_attribute_count_limit_keeps_the_last_ones_as_the_sdk_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "3")
    memory = InMemorySpanExporter()
    telemetry = Telemetry(settings(), environ={}, exporter=memory)
    telemetry.start()
    exchange = served()
    span = telemetry.open_span(exchange, Inbound(legacy_trace_id="turn-7"))
    assert span is not None
    exchange.status = 503
    telemetry.close_span(span, exchange)
    done = finished(telemetry, memory)
    expected = {"slm.client.trace_id": "turn-7", **span_attributes(exchange), "error.type": "503"}
    assert dict(done.attributes or {}) == dict(list(expected.items())[-3:])
    assert done.dropped_attributes == len(expected) - 3
    asyncio.run(telemetry.shutdown())
