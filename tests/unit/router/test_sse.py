"""The SSE tap: whole events forwarded, usage and finish reasons read, the usage chunk
the router asked for kept from the client."""

from __future__ import annotations

import json

from slm_server.router.exchange import Exchange
from slm_server.router.sse import SseTap


def event(body: dict[str, object]) -> bytes:
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


DELTA = event(
    {"id": "c1", "model": "m", "choices": [{"delta": {"content": "hi"}, "finish_reason": None}]}
)
LAST = event({"id": "c1", "choices": [{"delta": {}, "finish_reason": "length"}]})
USAGE = event({"id": "c1", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}})


def tap(drop: bool) -> tuple[SseTap, Exchange]:
    exchange = Exchange(request_id="r", method="POST", path="/v1/chat/completions")
    return SseTap(exchange, drop_usage_chunk=drop), exchange


def test_a_finish_reason_sharing_a_read_with_a_null_one_is_seen() -> None:
    sse, exchange = tap(drop=False)
    assert sse.feed(DELTA) == DELTA
    assert sse.feed(DELTA + LAST) == DELTA + LAST
    assert exchange.finish_reasons == ["length"]


def test_the_usage_chunk_the_router_asked_for_is_hidden_and_read() -> None:
    sse, exchange = tap(drop=True)
    forwarded = sse.feed(DELTA + LAST + USAGE + b"data: [DONE]\n\n")
    assert forwarded == DELTA + LAST + b"data: [DONE]\n\n"
    assert (exchange.input_tokens, exchange.output_tokens) == (3, 2)
    assert exchange.response_id == "c1"


def test_events_split_across_reads_are_forwarded_whole() -> None:
    sse, exchange = tap(drop=False)
    assert sse.feed(USAGE[:10]) == b""
    assert sse.feed(USAGE[10:]) == USAGE
    assert exchange.output_tokens == 2
    assert sse.feed(b"data: partial") == b""
    assert sse.flush() == b"data: partial"
