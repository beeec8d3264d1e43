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
:class:`~slm_server.router.call.exchange.Exchange`.

The SDK's own span objects (a lock, validated attributes and a processor call per
change) are not used on the request path: :meth:`Telemetry.open_span` decides with the
provider's sampler and id generator just as the SDK's tracer does and keeps an
:class:`OpenSpan`; :meth:`Telemetry.close_span` builds the finished ``ReadableSpan``
once, with every attribute, and hands it to the BatchSpanProcessor (so its bounded
queue, drop counting and ``OTEL_BSP_*`` settings apply as before). The exporter is the
router's own (:class:`~slm_server.router.observe.otlp_export.OtlpHttpExporter`): batches
encoded by :mod:`slm_server.router.observe.otlp_wire`, sent as the SDK's exporter sends
them.

The caller's W3C ``traceparent`` makes the span its child; without one the span starts
a trace, and a legacy ``X-Trace-Id`` is kept as ``slm.client.trace_id``. The span's own
context goes upstream as ``traceparent`` (via ``Exchange.upstream_headers``).

Settings: ``SLM_OTEL_ENABLED``, ``SLM_OTLP_ENDPOINT`` and ``SLM_OTEL_SERVICE_NAME`` own
what they name, so ``OTEL_EXPORTER_OTLP_*ENDPOINT``, ``OTEL_SERVICE_NAME`` and the
``service.name`` of ``OTEL_RESOURCE_ATTRIBUTES`` are overridden. The rest of the
standard variables apply as the SDK reads them: ``OTEL_SDK_DISABLED`` and
``OTEL_TRACES_EXPORTER=none`` (both turn export off), ``OTEL_BSP_*``,
``OTEL_TRACES_SAMPLER[_ARG]``, ``OTEL_RESOURCE_ATTRIBUTES``, and the exporter reads
``OTEL_EXPORTER_OTLP[_TRACES]_{HEADERS,TIMEOUT,COMPRESSION,CERTIFICATE,CLIENT_KEY,
CLIENT_CERTIFICATE}`` as the SDK's would.

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
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Final, NamedTuple

from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import (
    Event,
    ReadableSpan,
    SpanLimits,
    TracerProvider,
)
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, Decision, ParentBased, Sampler
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
    get_current_span,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from starlette.requests import Request
from starlette.responses import JSONResponse

from slm_server.router.apis.table import TABLE
from slm_server.router.call.exchange import Exchange
from slm_server.router.observe.otlp_export import ExportConfig, OtlpHttpExporter
from slm_server.settings import TelemetrySettings

log = logging.getLogger("slm_server.telemetry")

PROTOCOL: Final = "http/protobuf"
TRACES_PATH: Final = "/v1/traces"
EXPORT_TIMEOUT_SECONDS: Final = 3.0
SHUTDOWN_SECONDS: Final = 2.0
WARNING_INTERVAL_SECONDS: Final = 60.0
# Every distinct value of ``slm.emit_path``: one per emit site.
EMIT_SITES: Final = TABLE.emit_sites
# The loggers through which the exporter and the SDK complain about failed exports.
EXPORT_LOGGERS: Final = (
    "slm_server.telemetry.export",
    "opentelemetry.sdk._shared_internal",
    "opentelemetry.sdk.trace.export",
)
MAX_CAUSE: Final = 300
PROVIDERS: Final = {"llamacpp": "llama.cpp", "mlx": "mlx", "mlx-rerank": "mlx"}
MAX_TEXT: Final = 256
# Attributes whose values never repeat: not worth keeping encoded.
UNIQUE_ATTRIBUTES: Final = frozenset(
    {"slm.request_id", "gen_ai.response.id", "slm.client.trace_id"}
)
UNSET: Final = Status(StatusCode.UNSET)
FAILED: Final = Status(StatusCode.ERROR)

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
REPLICA: Final = "slm.replica"
ROUTING_RULE: Final = "slm.routing.rule"
PREFIX_MATCH: Final = "slm.routing.prefix_match_chars"
RECOVERY: Final = "slm.recovery"
RECOVERY_SECONDS: Final = "slm.recovery.seconds"
TOOL_MODE: Final = "slm.tools.mode"
TOOL_OUTCOME: Final = "slm.tools.outcome"
TOOL_CALLS: Final = "slm.tools.calls"
TOOL_REPAIRS: Final = "slm.tools.repairs"
TOOL_FAILED: Final = "slm.tools.failed_reason"


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


@dataclass(slots=True)
class OpenSpan:
    """A request's span between :meth:`Telemetry.open_span` and ``close_span``: its
    context, its parent's, when it started, and whether the sampler records it."""

    context: SpanContext
    parent: SpanContext | None
    start_ns: int
    recording: bool
    attributes: dict[str, Any]


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
        self.environ = env
        self.sdk_disabled = _truthy(env.get("OTEL_SDK_DISABLED")) or (
            env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none"
        )
        self.export_timeout: float | None = EXPORT_TIMEOUT_SECONDS
        if env.get("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT") or env.get("OTEL_EXPORTER_OTLP_TIMEOUT"):
            self.export_timeout = None  # the exporter reads them itself
        self._exporter = exporter
        self.provider: TracerProvider | None = None
        self.processor: BatchSpanProcessor | None = None
        self.warnings = ExportWarnings(self.traces_endpoint)
        self.propagator = TraceContextTextMapPropagator()
        self.scope = InstrumentationScope("slm_server", _package_version())
        self.limits = SpanLimits()
        self._sampler: Sampler | None = None
        # Whether the sampler records and samples every span with no parent, adding no
        # attribute and no trace state: the SDK's default and ``always_on``.
        self._every_root = False
        self._ids: IdGenerator | None = None
        self._resource = Resource.get_empty()

    @property
    def tracer(self) -> BatchSpanProcessor | None:
        """Whether spans are being made: the running span processor, else None."""
        return self.processor

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
                config = ExportConfig.from_environ(
                    self.traces_endpoint, self.environ, self.export_timeout
                )
                self._exporter = OtlpHttpExporter(config, UNIQUE_ATTRIBUTES)
            except Exception as exc:  # a bad OTEL_* setting must not stop the router
                log.warning("traces are off: the OTLP exporter cannot be set up: %s", exc)
                return
        resource = Resource.create(
            {"service.name": self.settings.service_name, "service.version": _package_version()}
        )
        provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        processor = BatchSpanProcessor(self._exporter)
        provider.add_span_processor(processor)
        for name in EXPORT_LOGGERS:
            logging.getLogger(name).addFilter(self.warnings)
        self._sampler, self._ids, self._resource = (
            provider.sampler,
            provider.id_generator,
            provider.resource,
        )
        self._every_root = samples_every_root(provider.sampler)
        self.provider, self.processor = provider, processor

    async def shutdown(self, timeout: float = SHUTDOWN_SECONDS) -> None:
        """Export what is queued and stop, waiting at most ``timeout`` seconds: past
        it, the exporter is told to stop retrying and the rest is dropped."""
        provider, exporter = self.provider, self._exporter
        self.provider = self.processor = None
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

    def open_span(self, exchange: Exchange, inbound: Inbound) -> OpenSpan | None:
        """Start the request's span, as a child of the caller's trace when it sent
        one, and put its context into ``exchange.upstream_headers``. The sampler and
        the id generator are the provider's, asked as the SDK's tracer asks them."""
        sampler, ids = self._sampler, self._ids
        if self.processor is None or sampler is None or ids is None:
            return None
        parent = None
        parent_context = None
        if inbound.traceparent is not None:
            carrier = {"traceparent": inbound.traceparent}
            if inbound.tracestate is not None:
                carrier["tracestate"] = inbound.tracestate
            extracted = self.propagator.extract(carrier)
            found = get_current_span(extracted).get_span_context()
            if found.is_valid:
                parent, parent_context = found, extracted
        trace_id = parent.trace_id if parent is not None else ids.generate_trace_id()
        if parent is None and self._every_root:
            # What the sampler would answer, without asking it: no span is ever made
            # current here, so a span with no inbound parent is a root to it too.
            decision: Decision = Decision.RECORD_AND_SAMPLE
            given: Mapping[str, Any] | None = None
            trace_state: TraceState = TraceState()
        else:
            sampled = sampler.should_sample(
                parent_context, trace_id, exchange.operation, SpanKind.CLIENT, None, ()
            )
            decision, given = sampled.decision, sampled.attributes
            trace_state = sampled.trace_state or TraceState()
        flags = TraceFlags.SAMPLED if decision is Decision.RECORD_AND_SAMPLE else TraceFlags.DEFAULT
        random = ids.is_trace_id_random() if parent is None else parent.trace_flags.random_trace_id
        if random:
            flags |= TraceFlags.RANDOM_TRACE_ID
        context = SpanContext(
            trace_id,
            ids.generate_span_id(),
            is_remote=False,
            trace_flags=TraceFlags(flags),
            trace_state=trace_state,
        )
        attributes = dict(given or {})
        if parent is None and inbound.legacy_trace_id is not None:
            attributes[CLIENT_TRACE_ID] = inbound.legacy_trace_id[:MAX_TEXT]
        headers = exchange.upstream_headers
        headers["traceparent"] = f"00-{trace_id:032x}-{context.span_id:016x}-{flags:02x}"
        if trace_state:
            headers["tracestate"] = trace_state.to_header()
        recording = decision is not Decision.DROP
        return OpenSpan(context, parent, time.time_ns(), recording, attributes)

    def close_span(
        self, span: OpenSpan, exchange: Exchange, error: BaseException | None = None
    ) -> None:
        """Name the span, give it the request's attributes and end it."""
        processor = self.processor
        if not span.recording or processor is None:
            return
        end_ns = time.time_ns()
        attributes = span.attributes
        attributes.update(span_attributes(exchange))
        name = exchange.operation
        if exchange.spec is not None and exchange.model:
            name = f"{exchange.operation} {exchange.model}"
        status = UNSET
        failure = error_type(exchange, error)
        if failure is not None:
            attributes[ERROR_TYPE] = failure
            status = FAILED
        limits = self.limits
        limited: Mapping[str, Any] = attributes
        if limits.max_span_attribute_length is not None or len(attributes) > (
            limits.max_span_attributes or len(attributes)
        ):
            limited = BoundedAttributes(
                limits.max_span_attributes,
                attributes,
                immutable=False,
                max_value_len=limits.max_span_attribute_length,
            )
        events = () if error is None else (self._exception_event(error),)
        processor.on_end(
            ReadableSpan(
                name=name,
                context=span.context,
                parent=span.parent,
                resource=self._resource,
                attributes=limited,
                events=events,
                kind=SpanKind.CLIENT,
                status=status,
                start_time=span.start_ns,
                end_time=end_ns,
                instrumentation_scope=self.scope,
            )
        )

    def _exception_event(self, error: BaseException) -> Event:
        """The ``exception`` event the SDK's ``record_exception`` makes."""
        kind = type(error)
        module = kind.__module__
        name = (
            f"{module}.{kind.__qualname__}"
            if module and module != "builtins"
            else kind.__qualname__
        )
        attributes = {
            "exception.type": name,
            "exception.message": str(error),
            "exception.stacktrace": "".join(traceback.format_exception(error)),
            "exception.escaped": "False",
        }
        return Event(
            "exception",
            BoundedAttributes(
                self.limits.max_event_attributes,
                attributes,
                max_value_len=self.limits.max_attribute_length,
                immutable=True,
            ),
        )

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


def _describe(sampler: Sampler) -> str:
    return sampler.get_description()


# The description of the SDK's default sampler, ``parentbased_always_on``.
DEFAULT_DESCRIPTION: Final = _describe(ParentBased(ALWAYS_ON))


def samples_every_root(sampler: Sampler) -> bool:
    """Whether ``sampler`` records and samples every span that has no parent, adding
    no attribute and no trace state: ``always_on``, or ``parentbased_always_on`` (the
    SDK's default), whose root is ``always_on``."""
    if sampler is ALWAYS_ON:
        return True
    # ParentBased keeps its root to itself; its description names every delegate.
    return type(sampler) is ParentBased and _describe(sampler) == DEFAULT_DESCRIPTION


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
        if exchange.routing_rule is not None:
            attributes[REPLICA] = spec.replica
            attributes[ROUTING_RULE] = exchange.routing_rule
            if exchange.prefix_match_chars is not None:
                attributes[PREFIX_MATCH] = exchange.prefix_match_chars
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
        (RECOVERY, exchange.recovery),
        (RECOVERY_SECONDS, exchange.recovery_seconds),
        (TOOL_MODE, exchange.tool_mode),
        (TOOL_OUTCOME, exchange.tool_outcome),
        (TOOL_FAILED, exchange.tool_failed),
    )
    for key, value in optional:
        if value is not None:
            attributes[key] = value
    if exchange.finish_reasons:
        attributes[FINISH_REASONS] = tuple(exchange.finish_reasons)
    if exchange.tool_mode is not None:
        attributes[TOOL_CALLS] = exchange.tool_calls
        if exchange.tool_repairs:
            attributes[TOOL_REPAIRS] = tuple(dict.fromkeys(exchange.tool_repairs))
    return attributes
