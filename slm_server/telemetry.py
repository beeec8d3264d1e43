"""OpenTelemetry traces: one span per request to a model endpoint, exported over
OTLP/HTTP (protobuf) to ``{SLM_OTLP_ENDPOINT}/v1/traces`` by a BatchSpanProcessor.

    telemetry = Telemetry(settings.telemetry)
    telemetry.start()                                  # in the app's lifespan
    span = telemetry.open_span(exchange, inbound)      # when the request arrives
    ...                                                # the request is served
    telemetry.close_span(span, exchange)               # when its answer has ended
    await telemetry.shutdown()                         # bounded, even with no collector

A span is started when the request arrives and ended once its answer — a relayed
stream included — has ended; it is never made the current span, so nothing depends on
context surviving a stream's yields. Its attributes follow the OpenTelemetry GenAI
semantic conventions and are all set at the end, from the request's
:class:`~slm_server.router.exchange.Exchange`.

The caller's W3C ``traceparent`` makes the span its child; without one the span starts
a trace, and a legacy ``X-Trace-Id`` is kept as ``slm.client.trace_id``. The span's own
context goes upstream as ``traceparent`` (via ``Exchange.upstream_headers``).

Settings: ``SLM_OTEL_ENABLED``, ``SLM_OTLP_ENDPOINT`` and ``SLM_OTEL_SERVICE_NAME`` own
what they name, so ``OTEL_EXPORTER_OTLP_*ENDPOINT``, ``OTEL_SERVICE_NAME`` and the
``service.name`` of ``OTEL_RESOURCE_ATTRIBUTES`` are overridden. The rest of the
standard variables apply as the SDK reads them: ``OTEL_SDK_DISABLED`` and
``OTEL_TRACES_EXPORTER=none`` (both turn export off), ``OTEL_BSP_*``,
``OTEL_TRACES_SAMPLER[_ARG]``, ``OTEL_RESOURCE_ATTRIBUTES``,
``OTEL_EXPORTER_OTLP[_TRACES]_{HEADERS,TIMEOUT,COMPRESSION,CERTIFICATE,...}``.

Export is fail-soft: with no collector, requests are unaffected, the exporter gives up
on a batch after a few seconds (``EXPORT_TIMEOUT_SECONDS`` unless
``OTEL_EXPORTER_OTLP[_TRACES]_TIMEOUT`` says otherwise), its complaints reach the log
at most once a minute (:class:`ExportWarnings`), and shutdown waits at most
``SHUTDOWN_SECONDS`` for the last batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Final, NamedTuple

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, get_current_span
from opentelemetry.trace import set_span_in_context as span_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from starlette.requests import Request
from starlette.responses import JSONResponse

from slm_server.router.exchange import EMIT_PATHS, Exchange
from slm_server.settings import TelemetrySettings

log = logging.getLogger("slm_server.telemetry")

PROTOCOL: Final = "http/protobuf"
TRACES_PATH: Final = "/v1/traces"
EXPORT_TIMEOUT_SECONDS: Final = 3.0
SHUTDOWN_SECONDS: Final = 2.0
WARNING_INTERVAL_SECONDS: Final = 60.0
# Every distinct value of ``slm.emit_path``: one per emit site.
EMIT_SITES: Final = (*dict.fromkeys(EMIT_PATHS.values()), "streaming")
# The loggers through which the SDK and the exporter complain about failed exports.
EXPORT_LOGGERS: Final = (
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.common.http",
    "opentelemetry.sdk._shared_internal",
    "opentelemetry.sdk.trace.export",
)
MAX_CAUSE: Final = 300
PROVIDERS: Final = {"llamacpp": "llama.cpp", "mlx": "mlx", "mlx-rerank": "mlx"}
MAX_TEXT: Final = 256

# Span attribute names (OpenTelemetry GenAI semantic conventions, plus ``slm.*``).
OPERATION: Final = "gen_ai.operation.name"
PROVIDER: Final = "gen_ai.provider.name"
REQUEST_MODEL: Final = "gen_ai.request.model"
RESPONSE_MODEL: Final = "gen_ai.response.model"
MAX_TOKENS: Final = "gen_ai.request.max_tokens"
TEMPERATURE: Final = "gen_ai.request.temperature"
TOP_P: Final = "gen_ai.request.top_p"
STREAM: Final = "gen_ai.request.stream"
RESPONSE_ID: Final = "gen_ai.response.id"
FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
FIRST_CHUNK: Final = "gen_ai.response.time_to_first_chunk"
SERVER_ADDRESS: Final = "server.address"
SERVER_PORT: Final = "server.port"
ERROR_TYPE: Final = "error.type"
HTTP_STATUS: Final = "http.response.status_code"
EMIT_PATH: Final = "slm.emit_path"
REQUEST_ID: Final = "slm.request_id"
CLIENT_TRACE_ID: Final = "slm.client.trace_id"


def _package_version() -> str:
    try:
        return version("slm-server")
    except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "0"


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


class Inbound(NamedTuple):
    """The trace headers of an inbound request (``None`` when absent)."""

    traceparent: str | None = None
    tracestate: str | None = None
    legacy_trace_id: str | None = None


class ExportWarnings(logging.Filter):
    """Lets through at most one export complaint per ``interval`` seconds, across
    every logger it is attached to, rewritten as one warning line that says what
    failed and how many were suppressed since the last one. Records below WARNING
    pass untouched."""

    def __init__(
        self,
        endpoint: str,
        interval: float = WARNING_INTERVAL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.endpoint = endpoint
        self.interval = interval
        self.clock = clock
        self.suppressed = 0
        self._last: float | None = None
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        now = self.clock()
        with self._lock:
            if self._last is not None and now - self._last < self.interval:
                self.suppressed += 1
                return False
            self._last = now
            suppressed, self.suppressed = self.suppressed, 0
        cause = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            cause += f": {record.exc_info[1]!r}"
        if len(cause) > MAX_CAUSE:
            cause = cause[: MAX_CAUSE - 3] + "..."
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.msg = (
            "trace export to %s is failing (%s); requests are unaffected; "
            "%d similar message(s) suppressed, the next in %gs at the earliest"
        )
        record.args = (self.endpoint, cause, suppressed, self.interval)
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        return True


class Telemetry:
    """The tracer provider of one router app, from start to shutdown."""

    def __init__(
        self,
        settings: TelemetrySettings,
        environ: Mapping[str, str] | None = None,
        exporter: SpanExporter | None = None,
    ) -> None:
        self.settings = settings
        env = os.environ if environ is None else environ
        self.sdk_disabled = _truthy(env.get("OTEL_SDK_DISABLED")) or (
            env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none"
        )
        self.export_timeout: float | None = EXPORT_TIMEOUT_SECONDS
        if env.get("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT") or env.get("OTEL_EXPORTER_OTLP_TIMEOUT"):
            self.export_timeout = None  # the exporter reads them itself
        self._exporter = exporter
        self.provider: TracerProvider | None = None
        self.tracer: Tracer | None = None
        self.warnings = ExportWarnings(self.traces_endpoint)
        self.propagator = TraceContextTextMapPropagator()

    @property
    def enabled(self) -> bool:
        return self.settings.enabled and not self.sdk_disabled

    @property
    def traces_endpoint(self) -> str:
        return self.settings.otlp_endpoint + TRACES_PATH

    def start(self) -> None:
        """Create the tracer provider and its exporter (nothing when disabled)."""
        if not self.enabled or self.provider is not None:
            return
        if self._exporter is None:
            try:
                self._exporter = OTLPSpanExporter(
                    endpoint=self.traces_endpoint, timeout=self.export_timeout
                )
            except Exception as exc:  # a bad OTEL_* setting must not stop the router
                log.warning("traces are off: the OTLP exporter cannot be set up: %s", exc)
                return
        resource = Resource.create(
            {"service.name": self.settings.service_name, "service.version": _package_version()}
        )
        provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        provider.add_span_processor(BatchSpanProcessor(self._exporter))
        for name in EXPORT_LOGGERS:
            logging.getLogger(name).addFilter(self.warnings)
        self.provider = provider
        self.tracer = provider.get_tracer("slm_server", _package_version())

    async def shutdown(self, timeout: float = SHUTDOWN_SECONDS) -> None:
        """Export what is queued and stop, waiting at most ``timeout`` seconds: past
        it, the exporter is told to stop retrying and the rest is dropped."""
        provider, exporter = self.provider, self._exporter
        self.provider = self.tracer = None
        if provider is None:
            return
        loop = asyncio.get_running_loop()
        done = asyncio.Event()

        def close() -> None:
            try:
                provider.shutdown()
            finally:
                # RuntimeError: the loop is gone, so nobody waits any more.
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(done.set)

        # A daemon thread rather than the loop's executor: an export stuck on a dead
        # collector must not hold up the interpreter's exit.
        threading.Thread(target=close, name="slm-telemetry-shutdown", daemon=True).start()
        try:
            await asyncio.wait_for(done.wait(), timeout)
        except TimeoutError:
            if exporter is not None:
                exporter.shutdown()  # ends the exporter's retry back-off at once
            log.info("trace export stopped after %gs of shutdown; unsent spans dropped", timeout)
        finally:
            # After a timeout the shutdown thread still runs and may still complain;
            # the filter stays on so its last words are rate-limited like the rest.
            if done.is_set():
                for name in EXPORT_LOGGERS:
                    logging.getLogger(name).removeFilter(self.warnings)

    def open_span(self, exchange: Exchange, inbound: Inbound) -> Span | None:
        """Start the request's span, as a child of the caller's trace when it sent
        one, and put its context into ``exchange.upstream_headers``."""
        tracer = self.tracer
        if tracer is None:
            return None
        parent = None
        if inbound.traceparent is not None:
            carrier = {"traceparent": inbound.traceparent}
            if inbound.tracestate is not None:
                carrier["tracestate"] = inbound.tracestate
            parent = self.propagator.extract(carrier)
            if not get_current_span(parent).get_span_context().is_valid:
                parent = None
        span = tracer.start_span(exchange.operation, context=parent, kind=SpanKind.CLIENT)
        if parent is None and inbound.legacy_trace_id is not None:
            span.set_attribute(CLIENT_TRACE_ID, inbound.legacy_trace_id[:MAX_TEXT])
        self.propagator.inject(exchange.upstream_headers, context=span_context(span))
        return span

    def close_span(
        self, span: Span, exchange: Exchange, error: BaseException | None = None
    ) -> None:
        """Name the span, give it the request's attributes and end it."""
        span.set_attributes(span_attributes(exchange))
        if exchange.spec is not None and exchange.model:
            span.update_name(f"{exchange.operation} {exchange.model}")
        failure = error_type(exchange, error)
        if failure is not None:
            span.set_attribute(ERROR_TYPE, failure)
            span.set_status(Status(StatusCode.ERROR))
        if error is not None:
            span.record_exception(error)
        span.end()

    def effective_config(self) -> dict[str, Any]:
        """The export configuration in effect, read from the live objects."""
        return {
            "service_name": self.settings.service_name,
            "otlp_endpoint": self.settings.otlp_endpoint,
            "otlp_traces_endpoint": self.traces_endpoint,
            "otlp_protocol": PROTOCOL,
            "telemetry_enabled": self.enabled,
            "tracer_provider_initialised": self.tracer is not None,
            "emit_paths": list(EMIT_SITES),
        }

    async def report(self, _request: Request) -> JSONResponse:
        """``GET /v1/telemetry/effective-config``."""
        return JSONResponse(self.effective_config())


def error_type(exchange: Exchange, error: BaseException | None = None) -> str | None:
    """``error.type`` for a failed request: the exception's class, the gateway's error
    code, ``cancelled``, or the HTTP status; ``None`` when it succeeded."""
    if error is not None:
        return type(error).__qualname__
    if exchange.disconnected:
        return "cancelled"
    if exchange.error_type is not None:
        return exchange.error_type
    status = exchange.status
    if status is not None and status >= 400:
        return str(status)
    return None


def span_attributes(exchange: Exchange) -> dict[str, Any]:
    """Every attribute of the request's span that the exchange knows."""
    attributes: dict[str, Any] = {
        OPERATION: exchange.operation,
        EMIT_PATH: exchange.emit_path,
        REQUEST_ID: exchange.request_id,
        STREAM: exchange.stream,
    }
    spec = exchange.spec
    if spec is not None:
        attributes[PROVIDER] = PROVIDERS.get(spec.entry.backend, spec.entry.backend)
        attributes[SERVER_ADDRESS] = spec.entry.host
        attributes[SERVER_PORT] = spec.entry.port
    optional = (
        (REQUEST_MODEL, exchange.model[:MAX_TEXT] if exchange.model else None),
        (RESPONSE_MODEL, exchange.response_model),
        (MAX_TOKENS, exchange.max_tokens),
        (TEMPERATURE, exchange.temperature),
        (TOP_P, exchange.top_p),
        (RESPONSE_ID, exchange.response_id),
        (INPUT_TOKENS, exchange.input_tokens),
        (OUTPUT_TOKENS, exchange.output_tokens),
        (FIRST_CHUNK, exchange.time_to_first_chunk),
        (HTTP_STATUS, exchange.status),
    )
    for key, value in optional:
        if value is not None:
            attributes[key] = value
    if exchange.finish_reasons:
        attributes[FINISH_REASONS] = tuple(exchange.finish_reasons)
    return attributes
