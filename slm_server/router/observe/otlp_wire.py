"""Finished spans as an OTLP ``ExportTraceServiceRequest``, protobuf-encoded by hand.

    data = encode_request(spans)        # bytes, as the SDK's encoder would make them

The SDK's encoder builds a protobuf message object per span, attribute and value, which
costs the router's export thread ~50 µs a span; this writes the same bytes directly
(fields in field-number order, proto3 defaults left out, ``AnyValue`` oneofs always
written), and remembers the encoded form of attribute pairs that repeat from span to
span (the model, the provider, the status...). Spans are grouped by resource and
instrumentation scope in the order they come, as the SDK does.

Anything it does not know how to write (a link, a mapping or bytes value, an integer
outside int64, a string that is not valid UTF-8) raises :class:`Unsupported`; the
caller then falls back to the SDK's encoder for that batch.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any, Final

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanKind

# OTLP SpanFlags: the flags field says whether the parent was remote.
HAS_IS_REMOTE: Final = 0x100
IS_REMOTE: Final = 0x200
KINDS: Final = {
    SpanKind.INTERNAL: 1,
    SpanKind.SERVER: 2,
    SpanKind.CLIENT: 3,
    SpanKind.PRODUCER: 4,
    SpanKind.CONSUMER: 5,
}
# Encoded (key, value) pairs kept for reuse; cleared when full.
MAX_CACHED_PAIRS: Final = 4096
_INT64: Final = 1 << 63
_pack_double = struct.Struct("<d").pack
_pack_fixed64 = struct.Struct("<Q").pack
_pack_fixed32 = struct.Struct("<I").pack
_SMALL: Final = tuple(bytes((n,)) for n in range(128))


class Unsupported(Exception):
    """A span this encoder cannot write; use the SDK's encoder instead."""


def varint(value: int) -> bytes:
    """``value`` (0 <= value < 2**64) as a protobuf varint."""
    if value < 128:
        return _SMALL[value]
    out = bytearray()
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _delimited(tag: bytes, data: bytes) -> bytes:
    return tag + varint(len(data)) + data


def _text(value: str) -> bytes:
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:
        raise Unsupported("a string that is not valid UTF-8") from None


def any_value(value: Any) -> bytes:
    """The body of an ``AnyValue`` holding ``value``."""
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, str):
        return _delimited(b"\x0a", _text(value))
    if isinstance(value, int):
        if not -_INT64 <= value < _INT64:
            raise Unsupported("an integer outside int64")
        return b"\x18" + varint(value if value >= 0 else value + (1 << 64))
    if isinstance(value, float):
        return b"\x21" + _pack_double(value)
    if value is None:
        return b""
    if isinstance(value, Sequence) and not isinstance(value, bytes | bytearray):
        values = b"".join(_delimited(b"\x0a", any_value(item)) for item in value)
        return _delimited(b"\x2a", values)
    raise Unsupported(f"an attribute value of type {type(value).__name__}")


class PairCache:
    """Encoded ``KeyValue`` messages by key and value, bounded; the values of
    ``unique_keys`` (ids that never repeat) are encoded every time instead."""

    def __init__(
        self, limit: int = MAX_CACHED_PAIRS, unique_keys: frozenset[str] = frozenset()
    ) -> None:
        self.limit = limit
        self.unique_keys = unique_keys
        self.size = 0
        # key -> value -> (the value's type, the encoded pair): 1 == True == 1.0.
        self._pairs: dict[str, dict[Any, tuple[type, bytes]]] = {}

    def attributes(self, tag: bytes, attributes: Mapping[str, Any] | None) -> bytes:
        """Every attribute as a ``KeyValue`` field ``tag``, in the mapping's order."""
        if not attributes:
            return b""
        pairs = self._pairs
        unique = self.unique_keys
        out = []
        for key, value in attributes.items():
            by_value = pairs.get(key)
            if by_value is None:
                by_value = pairs[key] = {}
            try:
                found = by_value.get(value)
            except TypeError:  # an unhashable value: encoded every time
                out.append(tag + _pair(key, value))
                continue
            if found is not None and found[0] is type(value):
                out.append(tag + found[1])
                continue
            encoded = _pair(key, value)
            if key not in unique:
                if self.size >= self.limit:
                    pairs.clear()
                    self.size = 0
                    by_value = pairs[key] = {}
                by_value[value] = (type(value), encoded)
                self.size += 1
            out.append(tag + encoded)
        return b"".join(out)


def _pair(key: str, value: Any) -> bytes:
    """A ``KeyValue`` message, length-prefixed."""
    return _delimited(b"", _delimited(b"\x0a", _text(key)) + _delimited(b"\x12", any_value(value)))


def _span(span: ReadableSpan, cache: PairCache) -> bytes:
    if span.links:
        raise Unsupported("a span with links")
    context = span.context
    if context is None:
        raise Unsupported("a span without a context")
    parts = [
        b"\x0a\x10" + context.trace_id.to_bytes(16, "big"),
        b"\x12\x08" + context.span_id.to_bytes(8, "big"),
    ]
    state = context.trace_state
    if state:
        parts.append(_delimited(b"\x1a", _text(",".join(f"{k}={v}" for k, v in state.items()))))
    parent = span.parent
    if parent:
        parts.append(b"\x22\x08" + parent.span_id.to_bytes(8, "big"))
    if span.name:
        parts.append(_delimited(b"\x2a", _text(span.name)))
    parts.append(b"\x30" + _SMALL[KINDS[span.kind]])
    if span.start_time:
        parts.append(b"\x39" + _pack_fixed64(span.start_time))
    if span.end_time:
        parts.append(b"\x41" + _pack_fixed64(span.end_time))
    parts.append(cache.attributes(b"\x4a", span.attributes))
    if span.dropped_attributes:
        parts.append(b"\x50" + varint(span.dropped_attributes))
    for event in span.events:
        body = b""
        if event.timestamp:
            body += b"\x09" + _pack_fixed64(event.timestamp)
        if event.name:
            body += _delimited(b"\x12", _text(event.name))
        body += cache.attributes(b"\x1a", event.attributes)
        if event.dropped_attributes:
            body += b"\x20" + varint(event.dropped_attributes)
        parts.append(_delimited(b"\x5a", body))
    if span.dropped_events:
        parts.append(b"\x60" + varint(span.dropped_events))
    if span.dropped_links:
        parts.append(b"\x70" + varint(span.dropped_links))
    status = span.status
    body = b""
    if status.description:
        body += _delimited(b"\x12", _text(status.description))
    if status.status_code.value:
        body += b"\x18" + varint(status.status_code.value)
    parts.append(_delimited(b"\x7a", body))
    flags = HAS_IS_REMOTE | (IS_REMOTE if parent is not None and parent.is_remote else 0)
    parts.append(b"\x85\x01" + _pack_fixed32(flags))
    return b"".join(parts)


def _resource(resource: Resource, cache: PairCache) -> bytes:
    return cache.attributes(b"\x0a", resource.attributes)


def _scope(scope: InstrumentationScope | None, cache: PairCache) -> bytes:
    if scope is None:
        return b""
    body = _delimited(b"\x0a", _text(scope.name)) if scope.name else b""
    if scope.version:
        body += _delimited(b"\x12", _text(scope.version))
    body += cache.attributes(b"\x1a", scope.attributes)
    return body


def encode_request(spans: Sequence[ReadableSpan], cache: PairCache | None = None) -> bytes:
    """The serialized ``ExportTraceServiceRequest`` for ``spans``."""
    cache = cache or PairCache()
    if not spans:
        return b""
    first = spans[0]
    resource, scope = first.resource, first.instrumentation_scope or None
    if all(s.resource is resource and (s.instrumentation_scope or None) is scope for s in spans):
        # The router's case: one resource and one scope, known without hashing them
        # (a Resource's hash serialises its attributes to JSON).
        encoded = [_delimited(b"\x12", _span(span, cache)) for span in spans]
        return _resource_spans(resource, {scope: encoded}, cache)
    grouped: dict[Resource, dict[InstrumentationScope | None, list[bytes]]] = {}
    for span in spans:
        scopes = grouped.setdefault(span.resource, {})
        scopes.setdefault(span.instrumentation_scope or None, []).append(
            _delimited(b"\x12", _span(span, cache))
        )
    return b"".join(_resource_spans(r, scopes, cache) for r, scopes in grouped.items())


def _resource_spans(
    resource: Resource,
    scopes: Mapping[InstrumentationScope | None, list[bytes]],
    cache: PairCache,
) -> bytes:
    """One ``ResourceSpans`` field: the resource and its scopes' encoded spans."""
    body = _delimited(b"\x0a", _resource(resource, cache))
    for scope, encoded in scopes.items():
        scope_body = _delimited(b"\x0a", _scope(scope, cache)) + b"".join(encoded)
        if scope is not None and scope.schema_url:
            scope_body += _delimited(b"\x1a", _text(scope.schema_url))
        body += _delimited(b"\x12", scope_body)
    if resource.schema_url:
        body += _delimited(b"\x1a", _text(resource.schema_url))
    return _delimited(b"\x0a", body)
