"""The hand-written OTLP encoding makes exactly the bytes of the SDK's encoder, and
refuses what it cannot write."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    Link,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)

from slm_server.router.observe.otlp_wire import PairCache, Unsupported, encode_request, varint

RESOURCE = Resource.create({"service.name": "svc", "service.version": "1.2"})
SCOPE = InstrumentationScope("slm_server", "0.1")
TRACE = 0x0AF7651916CD43DD8448EB211C80319C
PARENT = SpanContext(TRACE, 0xB7AD6B7169203331, is_remote=True, trace_flags=TraceFlags(1))


def span(
    attributes: dict[str, Any] | None = None,
    *,
    parent: SpanContext | None = PARENT,
    state: TraceState | None = None,
    resource: Resource = RESOURCE,
    scope: InstrumentationScope | None = SCOPE,
    **fields: Any,
) -> ReadableSpan:
    context = SpanContext(
        TRACE, 0x00F067AA0BA902B7, is_remote=False, trace_flags=TraceFlags(3), trace_state=state
    )
    values: dict[str, Any] = {
        "name": "chat alpha",
        "context": context,
        "parent": parent,
        "resource": resource,
        "attributes": attributes if attributes is not None else {"slm.request_id": "r-1"},
        "kind": SpanKind.CLIENT,
        "start_time": 1_700_000_000_123_456_789,
        "end_time": 1_700_000_000_223_456_789,
        "instrumentation_scope": scope,
    }
    values.update(fields)
    return ReadableSpan(**values)


def sdk_bytes(spans: list[ReadableSpan]) -> bytes:
    data: bytes = encode_spans(spans).SerializePartialToString()
    return data


ATTRIBUTES: dict[str, Any] = {
    "gen_ai.operation.name": "chat",
    "gen_ai.request.model": "ünïcode-módel",
    "gen_ai.request.max_tokens": 12,
    "gen_ai.request.temperature": 0.2,
    "gen_ai.request.top_p": 1.0,
    "gen_ai.request.stream": False,
    "gen_ai.response.finish_reasons": ("stop", "length"),
    "gen_ai.usage.input_tokens": 0,
    "big": 2**40,
    "negative": -5,
    "yes": True,
    "empty": "",
    "nothing": None,
    "mixed": (1, 2.5, "x", True),
    "long": "x" * 300,
}


@pytest.mark.parametrize(
    "spans",
    [
        [],
        [span()],
        [span(ATTRIBUTES)],
        [span(), span(scope=InstrumentationScope("other")), span()],
        [span(parent=None)],
        [span(parent=SpanContext(TRACE, 7, is_remote=False))],
        [span(state=TraceState([("vendor", "abc"), ("other", "1")]))],
        [span(status=Status(StatusCode.ERROR)), span(status=Status(StatusCode.ERROR, "why"))],
        [span(status=Status(StatusCode.OK))],
        [span(events=[Event("exception", {"exception.type": "KeyError"}, timestamp=5)])],
        [span(attributes={})],
        [span(scope=None)],
        [span(scope=InstrumentationScope("s", None, "https://schema", {"a": 1}))],
        [
            span(resource=Resource.create({"service.name": "b"}, schema_url="https://s")),
            span(ATTRIBUTES),
            span(resource=Resource.create({"service.name": "b"}, schema_url="https://s")),
        ],
        [span(ATTRIBUTES, name="")],
    ],
)
def test_the_bytes_are_the_sdks(spans: list[ReadableSpan]) -> None:
    assert encode_request(spans) == sdk_bytes(spans)


def test_repeated_pairs_are_encoded_once_and_the_cache_is_bounded() -> None:
    cache = PairCache(limit=3)
    first = encode_request([span(ATTRIBUTES)], cache)
    assert encode_request([span(ATTRIBUTES)], cache) == first == sdk_bytes([span(ATTRIBUTES)])
    assert cache.size <= 3


def test_unique_keys_are_not_kept() -> None:
    cache = PairCache(unique_keys=frozenset({"slm.request_id"}))
    assert encode_request([span(ATTRIBUTES)], cache) == sdk_bytes([span(ATTRIBUTES)])
    kept = cache.size
    assert encode_request([span()], cache) == sdk_bytes([span()])
    assert cache.size == kept


def test_equal_values_of_other_types_are_told_apart() -> None:
    cache = PairCache()
    for value in (1, True, 1.0, 1, True):
        one = span({"v": value})
        assert encode_request([one], cache) == sdk_bytes([one])


@pytest.mark.parametrize(
    "attributes",
    [{"m": {"a": 1}}, {"b": b"raw"}, {"i": 2**63}, {"s": "\ud800"}],
)
def test_what_it_cannot_write_is_refused(attributes: dict[str, Any]) -> None:
    with pytest.raises(Unsupported):
        encode_request([span(attributes)])


def test_a_span_with_links_is_refused() -> None:
    with pytest.raises(Unsupported):
        encode_request([span(links=[Link(PARENT)])])


@pytest.mark.parametrize("value", [0, 1, 127, 128, 300, 2**32, 2**64 - 1])
def test_varint(value: int) -> None:
    decoded, shift = 0, 0
    for byte in varint(value):
        decoded |= (byte & 0x7F) << shift
        shift += 7
    assert decoded == value
