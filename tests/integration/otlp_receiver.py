"""A real OTLP/HTTP trace receiver for tests: an HTTP server on a free local port, in a
thread, that decodes each ``POST /v1/traces`` (``ExportTraceServiceRequest``, protobuf)
with ``opentelemetry-proto`` and keeps the spans.

    with OtlpReceiver() as receiver:
        env = {"SLM_OTLP_ENDPOINT": receiver.url}
        ...
        span = receiver.span_for(request_id)      # polls until it has arrived
        assert span.attributes["gen_ai.request.model"] == "alpha"
"""

from __future__ import annotations

import gzip
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

SPAN_KIND_CLIENT = Span.SpanKind.SPAN_KIND_CLIENT
STATUS_ERROR = Status.StatusCode.STATUS_CODE_ERROR


def decode_value(value: AnyValue) -> Any:
    """An OTLP ``AnyValue`` as plain Python (arrays as tuples, kv lists as dicts)."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return tuple(decode_value(v) for v in value.array_value.values)
    if kind == "kvlist_value":
        return decode_attributes(value.kvlist_value.values)
    return getattr(value, kind)


def decode_attributes(pairs: Any) -> dict[str, Any]:
    items: list[KeyValue] = list(pairs)
    return {pair.key: decode_value(pair.value) for pair in items}


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]
    status_code: int
    resource: dict[str, Any]
    scope: str
    start_ns: int
    end_ns: int
    events: tuple[str, ...] = ()


@dataclass
class Received:
    spans: list[ReceivedSpan] = field(default_factory=list)
    posts: int = 0
    content_types: list[str] = field(default_factory=list)
    # Each POST's headers (names in lower case) and body, decompressed.
    headers: list[dict[str, str]] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)


class OtlpReceiver:
    """See the module docstring. ``status`` makes every export answer with that
    HTTP status instead of 200 (to exercise the exporter's failure path); the
    statuses in ``script`` are answered first, one per POST; ``retry_after`` is sent
    as ``Retry-After`` with every answer that is not 200. Spans are kept only from
    POSTs answered 200."""

    def __init__(
        self, status: int = 200, script: Sequence[int] = (), retry_after: str | None = None
    ) -> None:
        self.status = status
        self.script = list(script)
        self.retry_after = retry_after
        self.received = Received()
        self.changed = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                body = self.rfile.read(length)
                encoding = (self.headers.get("content-encoding") or "").lower()
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                headers = {name.lower(): value for name, value in self.headers.items()}
                status = receiver.record(self.path, headers, body)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(status)
                if status != 200 and receiver.retry_after is not None:
                    self.send_header("retry-after", receiver.retry_after)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # keep pytest's output clean

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    @property
    def url(self) -> str:
        """The base endpoint, as ``SLM_OTLP_ENDPOINT`` takes it."""
        return f"http://127.0.0.1:{self.port}"

    def record(self, path: str, headers: dict[str, str], body: bytes) -> int:
        """Keeps what a POST brought; the status to answer it with."""
        spans: list[ReceivedSpan] = []
        if path == "/v1/traces":
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            for resource_spans in request.resource_spans:
                resource = decode_attributes(resource_spans.resource.attributes)
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        spans.append(
                            ReceivedSpan(
                                name=span.name,
                                kind=span.kind,
                                trace_id=span.trace_id.hex(),
                                span_id=span.span_id.hex(),
                                parent_span_id=span.parent_span_id.hex(),
                                attributes=decode_attributes(span.attributes),
                                status_code=span.status.code,
                                resource=resource,
                                scope=scope_spans.scope.name,
                                start_ns=span.start_time_unix_nano,
                                end_ns=span.end_time_unix_nano,
                                events=tuple(event.name for event in span.events),
                            )
                        )
        with self.changed:
            status = self.script.pop(0) if self.script else self.status
            self.received.posts += 1
            self.received.content_types.append(headers.get("content-type", ""))
            self.received.headers.append(headers)
            self.received.bodies.append(body)
            if status == 200:
                self.received.spans.extend(spans)
            self.changed.notify_all()
        return status

    def wait_for_posts(self, count: int, timeout: float = 10.0) -> None:
        """Block until ``count`` POSTs have arrived; AssertionError after ``timeout``."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while self.received.posts < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"{self.received.posts} of {count} POSTs in {timeout}s")
                self.changed.wait(remaining)

    def spans(self) -> list[ReceivedSpan]:
        with self.changed:
            return list(self.received.spans)

    def wait_for(
        self, predicate: Callable[[list[ReceivedSpan]], bool], timeout: float = 10.0
    ) -> list[ReceivedSpan]:
        """Block until ``predicate(spans)`` holds; AssertionError after ``timeout``."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while not predicate(self.received.spans):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(
                        f"spans not received within {timeout}s; have {self.received.spans!r}"
                    )
                self.changed.wait(remaining)
            return list(self.received.spans)

    def span_for(self, request_id: str, timeout: float = 10.0) -> ReceivedSpan:
        """The one span whose ``slm.request_id`` is ``request_id``, once it arrived."""

        def mine(spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
            return [s for s in spans if s.attributes.get("slm.request_id") == request_id]

        spans = self.wait_for(lambda spans: bool(mine(spans)), timeout)
        found = mine(spans)
        assert len(found) == 1, f"expected one span for {request_id}, got {found!r}"
        return found[0]

    def start(self) -> OtlpReceiver:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    def __enter__(self) -> OtlpReceiver:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
