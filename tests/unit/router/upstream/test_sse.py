"""The router's one SSE parser: events cut whole however the stream frames its lines
(LF, CRLF, CR, split anywhere), linear in the bytes, bounded in size; the tap forwards
them event by event, reads usage and finish reasons, and keeps the usage chunk the
router asked for from the client."""

from __future__ import annotations

import json
import time

import pytest

from slm_server.errors import AnswerTooLarge, BackendProtocolError
from slm_server.router.apis.table import TABLE
from slm_server.router.call.exchange import Exchange
from slm_server.router.upstream.sse import DONE, SseSplitter, SseTap, data_object, event_data

CHAT_PATH = "/v1/chat/completions"


def event(body: dict[str, object]) -> bytes:
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


DELTA = event(
    {"id": "c1", "model": "m", "choices": [{"delta": {"content": "hi"}, "finish_reason": None}]}
)
LAST = event({"id": "c1", "choices": [{"delta": {}, "finish_reason": "length"}]})
USAGE = event({"id": "c1", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}})


def tap(drop: bool) -> tuple[SseTap, Exchange]:
    exchange = Exchange(request_id="r", method="POST", path=CHAT_PATH, shape=TABLE.at(CHAT_PATH))
    return SseTap(exchange, drop_usage_chunk=drop, max_event_bytes=1 << 20), exchange


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


PROGRESS = [
    event(
        {
            "id": "c1",
            "model": "m",
            "choices": [{"delta": {"role": "assistant", "content": None}, "finish_reason": None}],
            "prompt_progress": {"total": 9, "cache": 0, "processed": n, "time_ms": 1.0},
        }
    )
    for n in (0, 4, 9)
]


@pytest.mark.parametrize("size", [1, 7, 10_000])
def test_progress_reports_the_router_asked_for_are_dropped_however_they_arrive(size: int) -> None:
    exchange = Exchange(request_id="r", method="POST", path=CHAT_PATH, shape=TABLE.at(CHAT_PATH))
    sse = SseTap(exchange, drop_usage_chunk=True, max_event_bytes=1 << 20, drop_progress=True)
    stream = b"".join(PROGRESS) + DELTA + LAST + USAGE + b"data: [DONE]\n\n"
    forwarded = b"".join(sse.feed(stream[i : i + size]) for i in range(0, len(stream), size))
    assert forwarded + sse.flush() == DELTA + LAST + b"data: [DONE]\n\n"
    assert exchange.response_id == "c1"
    assert exchange.finish_reasons == ["length"]


def test_progress_reports_a_client_asked_for_are_forwarded() -> None:
    sse, _ = tap(drop=True)
    stream = b"".join(PROGRESS) + DELTA
    assert sse.feed(stream) == stream


def test_events_split_across_reads_are_forwarded_whole() -> None:
    sse, exchange = tap(drop=False)
    assert sse.feed(USAGE[:10]) == b""
    assert sse.feed(USAGE[10:]) == USAGE
    assert exchange.output_tokens == 2
    assert sse.feed(b"data: partial") == b""
    assert sse.flush() == b"data: partial"


def split_all(stream: bytes, size: int, max_event_bytes: int = 1 << 20) -> list[bytes]:
    """Feed ``stream`` in pieces of ``size`` bytes; every event that came out."""
    splitter = SseSplitter(max_event_bytes)
    events: list[bytes] = []
    for i in range(0, len(stream), size):
        for event in splitter.feed(stream[i : i + size]):
            if event == b"\n":  # the rest of a CRLF split after the CR that ended an event
                events[-1] += event
            else:
                events.append(event)
    assert splitter.flush() == b""
    return events


@pytest.mark.parametrize("end", [b"\n", b"\r\n", b"\r"], ids=["LF", "CRLF", "CR"])
@pytest.mark.parametrize("size", [1, 2, 3, 5, 1000])
def test_events_are_cut_whatever_the_line_ends_and_the_reads(end: bytes, size: int) -> None:
    one = b"event: delta" + end + b'data: {"a": 1}' + end + end
    two = b": a comment" + end + b"data: x" + end + b"data: y" + end + end
    done = b"data: [DONE]" + end + end
    assert split_all(one + two + done, size) == [one, two, done]


def test_a_crlf_split_between_reads_is_one_line_end() -> None:
    splitter = SseSplitter(1 << 20)
    assert splitter.feed(b"data: a\r") == []
    assert splitter.feed(b"\n") == []  # the LF of the CRLF: not a blank line
    assert splitter.feed(b"\r") == [b"data: a\r\n\r"]  # at once: it may be CR framing
    assert splitter.feed(b"\ndata: b\r\n\r\n") == [b"\n", b"data: b\r\n\r\n"]


def test_an_event_is_forwarded_as_soon_as_its_blank_line_arrives() -> None:
    splitter = SseSplitter(1 << 20)
    assert splitter.feed(b"data: a\r\n") == []
    assert splitter.feed(b"\r\n") == [b"data: a\r\n\r\n"]


def test_an_event_past_the_limit_is_too_large_even_without_a_line_end() -> None:
    splitter = SseSplitter(100)
    splitter.feed(b"data: " + b"x" * 90)
    with pytest.raises(AnswerTooLarge) as raised:
        splitter.feed(b"x" * 20)
    assert raised.value.code == "sse_event_too_large"
    assert raised.value.status == 502
    with pytest.raises(AnswerTooLarge):
        SseSplitter(100).feed(b"data: " + b"y" * 200 + b"\n\n")


def test_an_event_at_the_limit_passes() -> None:
    event = b"data: " + b"x" * 92 + b"\n\n"
    assert len(event) == 100
    assert SseSplitter(100).feed(event) == [event]


def test_an_endless_event_costs_linear_time() -> None:
    """100 MB in 4 KiB reads without a blank line: each byte scanned once (the old tap
    re-scanned everything held on every read: about 98 s for this)."""
    splitter = SseSplitter(200 * 1024 * 1024)
    piece = b"x" * 4096
    started = time.process_time()
    for _ in range(25_000):
        assert splitter.feed(piece) == []
    assert time.process_time() - started < 5.0
    assert len(splitter.flush()) == 25_000 * 4096


@pytest.mark.parametrize(
    ("event", "data"),
    [
        (b"data: a\n\n", b"a"),
        (b"data:a\r\n\r\n", b"a"),
        (b"data:  two spaces\n\n", b" two spaces"),
        (b"data: x\ndata: y\n\n", b"x\ny"),
        (b"event: e\r: c\rdata: z\r\r", b"z"),
        (b"data\n\n", b""),
        (b": only a comment\n\n", None),
        (b"dataset: no\n\n", None),
    ],
)
def test_event_data(event: bytes, data: bytes | None) -> None:
    assert event_data(event) == data


def test_data_object() -> None:
    assert data_object(b'data: {"a": 1}\r\n\r\n') == {"a": 1}
    assert data_object(b"data: [DONE]\n\n") is DONE
    assert data_object(b": keep-alive\n\n") is None
    assert data_object(b"data:\n\n") is None
    for bad in (b"data: {nope\n\n", b"data: [1, 2]\n\n", b"data: " + b"[" * 100_000 + b"\n\n"):
        with pytest.raises(BackendProtocolError):
            data_object(bad)


def test_the_tap_reads_crlf_events_and_forwards_their_bytes_untouched() -> None:
    sse, exchange = tap(drop=True)
    crlf = [e.replace(b"\n", b"\r\n") for e in (DELTA, LAST, USAGE)]
    assert sse.feed(crlf[0]) == crlf[0]
    assert sse.feed(crlf[1] + crlf[2]) == crlf[1]
    assert exchange.finish_reasons == ["length"]
    assert exchange.output_tokens == 2


def test_the_end_of_llama_server_s_own_stream_is_read_for_the_record() -> None:
    """/infill and /completion stream llama-server's own events: the last one carries
    the token counts and why it stopped, with no usage and no finish_reason."""
    exchange = Exchange(request_id="r", method="POST", path="/infill", shape=TABLE.at("/infill"))
    sse = SseTap(exchange, drop_usage_chunk=False, max_event_bytes=1 << 20)
    piece = event({"index": 0, "content": "a", "stop": False, "tokens_predicted": 1})
    end = event(
        {
            "content": "",
            "stop": True,
            "stop_type": "limit",
            "tokens_predicted": 4,
            "tokens_evaluated": 9,
        }
    )
    assert sse.feed(piece) == piece
    assert sse.feed(piece) == piece
    assert sse.feed(end) == end
    assert (exchange.input_tokens, exchange.output_tokens) == (9, 4)
    assert exchange.finish_reasons == ["length"]
