"""The SSE splitter (router/answer/sse.py) under attack: every way of cutting a stream into
reads, empty reads included, must give the same events; CRs at read ends; events at,
just over and just under the size limit; complete events ahead of an oversized one."""

from __future__ import annotations

import contextlib
import itertools
import re
from collections.abc import Iterable

import pytest

from slm_server.errors import AnswerTooLarge
from slm_server.router.upstream.sse import SseSplitter, event_data

STREAMS = [
    b"data: a\n\ndata: b\n\n",
    b"data: a\r\n\r\ndata: b\r\n\r\n",
    b"data: a\r\rdata: b\r\r",
    b"data: a\r\ndata: b\r\n\r\ndata: c\n\n",
    b"data: a\rdata: b\r\r\ndata: c\r\n\r\n",
    b": keep-alive\n\ndata: x\r\n\n\rdata: y\n\r",
    b"event: e\r\ndata: 1\r\ndata: 2\r\n\r\n\r\n\r\n",
]


def reference(stream: bytes) -> list[bytes]:
    """The data of each event, by the SSE standard's line rules, read whole."""
    lines = re.split(rb"\r\n|\r|\n", stream)
    events: list[bytes] = []
    current: list[bytes] = []
    for line in lines[:-1]:  # the last piece has no line end: not a line yet
        if line:
            current.append(line)
            continue
        data = event_data(b"\n".join(current) + b"\n\n") if current else None
        if data is not None:
            events.append(data)
        current = []
    return events


def split_run(stream: bytes, cuts: tuple[int, ...], empties: bool) -> tuple[list[bytes], bytes]:
    splitter = SseSplitter(1 << 20)
    bounds = [0, *cuts, len(stream)]
    events: list[bytes] = []
    for start, end in itertools.pairwise(bounds):
        events += splitter.feed(stream[start:end])
        if empties:
            events += splitter.feed(b"")
    return events, splitter.flush()


def feed_all(splitter: SseSplitter, reads: Iterable[bytes]) -> None:
    for piece in reads:
        splitter.feed(piece)


def data_of(events: list[bytes]) -> list[bytes]:
    return [d for d in (event_data(e) for e in events) if d is not None]


@pytest.mark.parametrize("stream", STREAMS)
def test_any_two_cuts_give_the_same_events_and_bytes(stream: bytes) -> None:
    expected = reference(stream)
    for cuts in itertools.combinations(range(1, len(stream)), 2):
        events, rest = split_run(stream, cuts, empties=False)
        assert b"".join(events) + rest == stream, cuts
        assert data_of(events) == expected, cuts


def test_every_event_ends_with_its_blank_line_at_any_single_cut() -> None:
    lone = {b"\n", b"\r", b"\r\n"}  # an empty event, or the LF of a CRLF that ended one
    for stream in STREAMS:
        for cut in range(1, len(stream)):
            events, _ = split_run(stream, (cut,), empties=False)
            for event in events:
                ended = re.search(rb"(\r\n|\r|\n)(\r\n|\r|\n)$", event)
                assert event in lone or ended, (stream, cut, event)


def test_empty_reads_between_any_cuts_change_nothing() -> None:
    for stream in STREAMS:
        expected = reference(stream)
        for cut in range(1, len(stream)):
            events, rest = split_run(stream, (cut,), empties=True)
            assert b"".join(events) + rest == stream, cut
            assert data_of(events) == expected, (stream, cut, events)


def test_an_empty_read_between_cr_and_lf_minimal() -> None:
    splitter = SseSplitter(1024)
    assert splitter.feed(b"data: a\r") == []
    assert splitter.feed(b"") == []
    # With the bug: [b"data: a\r\n", b"data: b\n\n"], one event cut in two.
    assert splitter.feed(b"\ndata: b\n\n") == [b"data: a\r\ndata: b\n\n"]


def test_a_cr_at_a_read_end_followed_by_other_bytes_ends_just_the_line() -> None:
    splitter = SseSplitter(1024)
    assert splitter.feed(b"data: a\r") == []
    assert splitter.feed(b"data: b\r") == []
    assert splitter.feed(b"\r") == [b"data: a\rdata: b\r\r"]
    assert splitter.feed(b"\n") == [b"\n"]  # the LF of the CRLF that ended it
    assert splitter.feed(b"data: c\n\n") == [b"data: c\n\n"]
    assert splitter.flush() == b""


@pytest.mark.parametrize("ending", [b"\n\n", b"\r\r", b"\r\n\r\n"])
@pytest.mark.parametrize("step", [1, 3, 7, 1000])
def test_an_event_exactly_at_the_limit_passes_one_byte_more_does_not(
    ending: bytes, step: int
) -> None:
    limit = 64
    exact = b"data: " + b"x" * (limit - 6 - len(ending)) + ending
    assert len(exact) == limit
    splitter = SseSplitter(limit)
    events: list[bytes] = []
    for i in range(0, limit, step):
        events += splitter.feed(exact[i : i + step])
    assert b"".join(events) == exact  # a CRLF's last LF may come by itself
    assert data_of(events) == [b"x" * (limit - 6 - len(ending))]
    over = b"data: " + b"x" * (limit - 5 - len(ending)) + ending
    # (a CRLF-ended one split before its last LF: see the test below)
    reads = (
        [over] if ending == b"\r\n\r\n" else [over[i : i + step] for i in range(0, len(over), step)]
    )
    splitter = SseSplitter(limit)
    with pytest.raises(AnswerTooLarge):
        feed_all(splitter, reads)


def test_a_crlf_event_one_over_the_limit_split_before_its_last_lf_is_refused() -> None:
    limit = 64
    over = b"data: " + b"x" * (limit - 9) + b"\r\n\r\n"
    assert len(over) == limit + 1
    splitter = SseSplitter(limit)
    with pytest.raises(AnswerTooLarge):
        feed_all(splitter, [over[:-1], over[-1:]])


def test_complete_events_ahead_of_an_oversized_one_in_the_same_read_are_kept() -> None:
    splitter = SseSplitter(100)
    small = b"data: a\n\n"
    huge = b"data: " + b"x" * 200 + b"\n\n"
    delivered: list[bytes] = []
    with contextlib.suppress(AnswerTooLarge):
        delivered += splitter.feed(small + huge)
    assert delivered == [small]


def test_an_endless_event_is_cut_at_the_limit_with_bounded_parts() -> None:
    splitter = SseSplitter(10_000)
    splitter.feed(b"data: ")
    with pytest.raises(AnswerTooLarge):
        feed_all(splitter, [b"y" * 100] * 1_000)
    # After the refusal nothing of the endless event is kept.
    assert splitter.flush() == b""


def test_many_tiny_events_in_one_read_are_all_cut() -> None:
    stream = b"data: 1\n\n" * 10_000
    events = SseSplitter(16).feed(stream)
    assert len(events) == 10_000
    assert set(events) == {b"data: 1\n\n"}


def test_blank_lines_alone_make_no_data() -> None:
    splitter = SseSplitter(16)
    events = splitter.feed(b"\n\n\r\n\r\r")
    assert b"".join(events) == b"\n\n\r\n\r\r"
    assert data_of(events) == []
