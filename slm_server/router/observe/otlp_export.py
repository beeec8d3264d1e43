"""The router's OTLP/HTTP span exporter: batches encoded by
:mod:`slm_server.router.observe.otlp_wire` and POSTed with httpx to
``{SLM_OTLP_ENDPOINT}/v1/traces``, as the SDK's ``OTLPSpanExporter`` sends them.

    config = ExportConfig.from_environ("http://collector:4318/v1/traces", os.environ, 3.0)
    exporter = OtlpHttpExporter(config)      # a SpanExporter, for a BatchSpanProcessor
    exporter.export(spans)                   # SUCCESS, or FAILURE once it gave up
    exporter.shutdown()                      # ends a retry's back-off at once

The SDK's encoder costs the export thread about six times what ``otlp_wire`` does per
span (``benchmarks/otlp_encoding.py``), and its exporter offers no public way to send
bytes encoded elsewhere; so the HTTP side is the router's too, built on public API
only, and behaves as the SDK's did:

- ``Content-Type: application/x-protobuf`` and the SDK exporter's ``User-Agent``; the
  headers of ``OTEL_EXPORTER_OTLP_TRACES_HEADERS`` (else ``OTEL_EXPORTER_OTLP_HEADERS``),
  parsed as the SDK parses them;
- each batch given up after the timeout (the router's 3 s unless
  ``OTEL_EXPORTER_OTLP[_TRACES]_TIMEOUT`` says otherwise, in seconds, as the SDK reads
  it), retried within it on 429, 502, 503, 504 and on connection errors, backing off
  1, 2, 4... s (±20 %) or as ``Retry-After`` says, at most 6 attempts; a connection
  error is first retried at once (a stale pooled connection);
- ``OTEL_EXPORTER_OTLP[_TRACES]_COMPRESSION`` (``gzip``, ``deflate``),
  ``_CERTIFICATE``, ``_CLIENT_CERTIFICATE`` and ``_CLIENT_KEY``; proxies and CA bundles
  from the environment as httpx reads them;
- a batch whose encoding is over 64 MiB is dropped, with a warning;
- after :meth:`OtlpHttpExporter.shutdown` nothing more is sent and a back-off ends.

A batch ``otlp_wire`` cannot write (a value type the router never sets) is encoded by
the SDK's public ``encode_spans``. Complaints go to the ``slm_server.telemetry.export``
logger, which :class:`~slm_server.router.observe.telemetry.ExportWarnings` rate-limits.
The SDK exporter's self-metrics (``otel.sdk.exporter.*``, off unless
``OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED`` and a global meter provider are set; the
router sets neither) are not made.
"""

from __future__ import annotations

import gzip
import logging
import math
import random
import ssl
import threading
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from importlib.metadata import PackageNotFoundError, version
from typing import Final
from urllib.parse import urlsplit

import httpx
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.util.re import parse_env_headers

from slm_server.router.observe.otlp_wire import PairCache, Unsupported, encode_request

log = logging.getLogger("slm_server.telemetry.export")

CONTENT_TYPE: Final = "application/x-protobuf"
DEFAULT_TIMEOUT_SECONDS: Final = 10.0
MAX_ATTEMPTS: Final = 6
JITTER: Final = 0.2
RETRYABLE_STATUSES: Final = frozenset({429, 502, 503, 504})
MAX_REQUEST_BYTES: Final = 64 * 1024 * 1024
COMPRESSIONS: Final = ("none", "gzip", "deflate")
# Errors of the connection rather than of the collector's answer: worth a retry.
CONNECTION_ERRORS: Final = (
    httpx.NetworkError,
    httpx.TimeoutException,
    httpx.ProxyError,
    httpx.RemoteProtocolError,
)


def _user_agent() -> str:
    """The ``User-Agent`` the SDK's OTLP/HTTP exporter sends (same bytes, same name)."""
    try:
        release = version("opentelemetry-exporter-otlp-proto-http")
    except PackageNotFoundError:  # pragma: no cover - the package is a dependency
        release = "0"
    return f"OTel-OTLP-Exporter-Python/{release}"


def _setting(environ: Mapping[str, str], name: str) -> str | None:
    """``OTEL_EXPORTER_OTLP_TRACES_<name>``, else ``OTEL_EXPORTER_OTLP_<name>``."""
    value = environ.get(f"OTEL_EXPORTER_OTLP_TRACES_{name}") or environ.get(
        f"OTEL_EXPORTER_OTLP_{name}"
    )
    return value or None


@dataclass(frozen=True)
class ExportConfig:
    """Where and how batches are sent."""

    endpoint: str
    timeout: float = DEFAULT_TIMEOUT_SECONDS
    headers: Mapping[str, str] = field(default_factory=dict)
    compression: str = "none"
    certificate: str | None = None
    client_certificate: str | None = None
    client_key: str | None = None
    max_request_bytes: int = MAX_REQUEST_BYTES

    @classmethod
    def from_environ(
        cls, endpoint: str, environ: Mapping[str, str], timeout: float | None
    ) -> ExportConfig:
        """The configuration the SDK's exporter would resolve from ``environ`` for
        ``endpoint``; ``timeout`` (seconds) unless it is None."""
        if timeout is None:
            raw = _setting(environ, "TIMEOUT") or str(DEFAULT_TIMEOUT_SECONDS)
            try:
                timeout = float(raw)
            except ValueError:
                log.warning("Invalid timeout value %r, using %gs", raw, DEFAULT_TIMEOUT_SECONDS)
                timeout = DEFAULT_TIMEOUT_SECONDS
        compression = (_setting(environ, "COMPRESSION") or "none").strip().lower()
        if compression not in COMPRESSIONS:
            log.warning("Unsupported compression type: %s", compression)
            compression = "none"
        headers = {"content-type": CONTENT_TYPE, "user-agent": _user_agent()}
        headers.update(parse_env_headers(_setting(environ, "HEADERS") or "", liberal=True))
        if compression != "none" and "content-encoding" not in headers:
            headers["content-encoding"] = compression
        return cls(
            endpoint=endpoint,
            timeout=timeout,
            headers=headers,
            compression=compression,
            certificate=_setting(environ, "CERTIFICATE"),
            client_certificate=_setting(environ, "CLIENT_CERTIFICATE"),
            client_key=_setting(environ, "CLIENT_KEY"),
        )

    def tls(self) -> ssl.SSLContext | bool:
        """What httpx is given as ``verify``: a context when a certificate is
        configured for an https endpoint (loaded now, so a missing file says so at
        start-up), else httpx's default verification."""
        if urlsplit(self.endpoint).scheme != "https" or not (
            self.certificate or self.client_certificate
        ):
            return True
        if self.certificate:
            context = ssl.create_default_context(cafile=self.certificate)
        else:
            context = httpx.create_ssl_context()
        if self.client_certificate:
            context.load_cert_chain(self.client_certificate, self.client_key)
        return context


def retry_after(value: str | None, now: Callable[[], float] = time.time) -> float | None:
    """Seconds to wait that a ``Retry-After`` header asks for (RFC 9110: seconds or
    an HTTP date), or None when it is absent or unreadable."""
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return max(seconds, 0.0) if math.isfinite(seconds) else None
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - now(), 0.0)


class Attempt:
    """What one POST came to: a status (with its reason and ``Retry-After``), or the
    error that kept it from getting one."""

    __slots__ = ("error", "reason", "retry_after", "status")

    def __init__(
        self,
        status: int | None = None,
        reason: str = "",
        retry_after: float | None = None,
        error: Exception | None = None,
    ) -> None:
        self.status, self.reason, self.retry_after, self.error = status, reason, retry_after, error

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 400

    @property
    def retryable(self) -> bool:
        if self.status is not None:
            return self.status in RETRYABLE_STATUSES
        return isinstance(self.error, CONNECTION_ERRORS)

    def __str__(self) -> str:
        if self.status is not None:
            return f"code: {self.status}, reason: {self.reason or 'unknown'}"
        return f"{self.error!r}"


class OtlpHttpExporter(SpanExporter):
    """See the module docstring. ``unique_keys`` are attribute keys whose values never
    repeat (request ids), which the encoder does not keep."""

    def __init__(
        self,
        config: ExportConfig,
        unique_keys: frozenset[str] = frozenset(),
    ) -> None:
        self.config = config
        self.pairs = PairCache(unique_keys=unique_keys)
        self.client = httpx.Client(
            verify=config.tls(),
            follow_redirects=False,
            trust_env=True,
        )
        self.stopping = threading.Event()
        self.stopped = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self.stopped:
            log.warning("Exporter already shut down, ignoring a batch of %d spans", len(spans))
            return SpanExportResult.FAILURE
        try:
            try:
                data = encode_request(spans, self.pairs)
            except Unsupported:
                data = _sdk_encoded(spans)
        except Exception as exc:  # a span no encoder can write: drop the batch
            log.error("Failed to encode a batch of %d spans: %r", len(spans), exc)
            return SpanExportResult.FAILURE
        limit = self.config.max_request_bytes
        if 0 < limit < len(data):
            log.warning(
                "Dropping a batch of %d spans: %d bytes encoded, over the %d-byte limit",
                len(spans),
                len(data),
                limit,
            )
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS if self.send(data) else SpanExportResult.FAILURE

    def send(self, data: bytes) -> bool:
        """POST ``data`` (an encoded ``ExportTraceServiceRequest``), retrying what is
        worth retrying until the timeout; whether the collector took it."""
        body = self._compress(data)
        deadline = time.monotonic() + self.config.timeout
        for attempt in range(MAX_ATTEMPTS):
            backoff = 2**attempt * random.uniform(1 - JITTER, 1 + JITTER)
            sent = self._post(body, deadline)
            if sent.ok:
                return True
            if not sent.retryable:
                log.error("Failed to export spans batch %s", sent)
                return False
            if sent.retry_after is not None:
                backoff = sent.retry_after
            if (
                attempt + 1 == MAX_ATTEMPTS
                or backoff > deadline - time.monotonic()
                or self.stopping.is_set()
            ):
                log.error("Failed to export spans batch (%s): timeout, retries or shutdown", sent)
                return False
            log.warning("Transient error exporting spans batch (%s), retry in %.2fs", sent, backoff)
            if self.stopping.wait(backoff):
                log.warning("Shutdown in progress, aborting retry")
                return False
        return False  # pragma: no cover - the loop's last attempt always returns

    def _post(self, body: bytes, deadline: float) -> Attempt:
        sent = self._post_once(body, deadline)
        if isinstance(sent.error, CONNECTION_ERRORS) and deadline > time.monotonic():
            # A pooled connection the collector closed: once more, at once.
            sent = self._post_once(body, deadline)
        return sent

    def _post_once(self, body: bytes, deadline: float) -> Attempt:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return Attempt(error=httpx.TimeoutException("no time left before the deadline"))
        try:
            response = self.client.post(
                self.config.endpoint,
                content=body,
                headers=self.config.headers,
                timeout=remaining,
            )
        except Exception as exc:  # any failure to send is this attempt's outcome
            return Attempt(error=exc)
        return Attempt(
            response.status_code,
            response.reason_phrase,
            retry_after(response.headers.get("retry-after")),
        )

    def _compress(self, data: bytes) -> bytes:
        if self.config.compression == "gzip":
            return gzip.compress(data)
        if self.config.compression == "deflate":
            return zlib.compress(data)
        return data

    def shutdown(self) -> None:
        """Send nothing more; a retry waiting out its back-off gives up at once."""
        if self.stopped:
            return
        self.stopped = True
        self.stopping.set()
        self.client.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Nothing is buffered here."""
        return True


def _sdk_encoded(spans: Sequence[ReadableSpan]) -> bytes:
    """The batch as the SDK's public encoder writes it: imported only when a span needs
    it, since protobuf's generated modules take a fifth of the router's start-up."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    data: bytes = encode_spans(spans).SerializePartialToString()
    return data
