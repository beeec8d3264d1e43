"""The splitter's shortcuts, for a read that is one whole LF-framed event and for a
read whose lines all end in LF, change nothing: the same events, the same refusals, as
scanning line by line."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from slm_server.errors import AnswerTooLarge
from slm_server.router.upstream.sse import SseSplitter, _worth_parsing


class Scanning(SseSplitter):
    """The splitter with the shortcuts off."""

    def take_whole(self, chunk: bytes) -> bool:
        return False

    def _split(self, chunk: bytes, events: list[bytes]) -> None:
        self._scan(chunk, events)


class NoWholeShortcut(SseSplitter):
    """The splitter with only the shortcut for LF-framed reads."""

    def take_whole(self, chunk: bytes) -> bool:
        return False


def run(splitter: SseSplitter, reads: list[bytes]) -> list[bytes | str]:
    out: list[bytes | str] = []
    for read in reads:
        try:
            out.extend(splitter.feed(read))
        except AnswerTooLarge:
            out.append("refused")
    try:
        out.append(splitter.flush())
    except AnswerTooLarge:
        out.append("refused")
    return out


PIECES = st.sampled_from(
    [b"data: {}\n\n", b"data: x", b"\n", b"\r", b"\r\n", b"\n\n", b": ping\n\n", b"event: a\n"]
)
READS = st.lists(st.lists(PIECES, max_size=4).map(b"".join), max_size=12)


@given(READS, st.integers(min_value=4, max_value=40))
def test_the_shortcuts_split_as_the_scan_does(reads: list[bytes], limit: int) -> None:
    expected = run(Scanning(limit), reads)
    assert run(SseSplitter(limit), reads) == expected
    assert run(NoWholeShortcut(limit), reads) == expected


LF_PIECES = st.sampled_from(
    [b"data: {}\n\n", b"data: x", b"\n", b"\n\n", b"\n\n\n", b": ping\n\n", b"event: a\n", b"d"]
)
LF_READS = st.lists(st.lists(LF_PIECES, max_size=8).map(b"".join), max_size=12)


@given(LF_READS, st.integers(min_value=4, max_value=60))
def test_reads_of_many_lf_events_split_as_the_scan_does(reads: list[bytes], limit: int) -> None:
    assert run(NoWholeShortcut(limit), reads) == run(Scanning(limit), reads)


def test_a_read_of_many_lf_events_is_cut_by_find_not_by_the_line_scan() -> None:
    scans: list[bytes] = []

    class Watched(SseSplitter):
        def _scan(self, chunk: bytes, events: list[bytes]) -> None:
            scans.append(chunk)
            super()._scan(chunk, events)

    splitter = Watched(1000)
    events = [b"data: %d\n\n" % i for i in range(20)]
    assert splitter.feed(b"".join(events)) == events
    assert splitter.feed(b"data: a\r\n\r\n") == [b"data: a\r\n\r\n"]
    assert scans == [b"data: a\r\n\r\n"]  # only the read with a CR is scanned line by line


def test_one_whole_event_per_read_takes_the_shortcut() -> None:
    splitter = SseSplitter(100)
    assert splitter.take_whole(b"data: 1\n\n")
    assert not splitter.take_whole(b"data: 1\n\ndata: 2\n\n")
    assert not splitter.take_whole(b"\ndata: 1\n\n")
    assert not splitter.take_whole(b"data: 1\r\n\r\n")
    assert not splitter.take_whole(b"x")
    assert not SseSplitter(5).take_whole(b"data: 1\n\n")


def test_worth_parsing() -> None:
    assert _worth_parsing(b'data: {"usage": {}}\n\n')
    assert _worth_parsing(b'data: {"error": "x"}\n\n')
    assert _worth_parsing(b'data: {"finish_reason" : "stop"}\n\n')
    assert not _worth_parsing(b'data: {"finish_reason": null}\n\n')
    assert not _worth_parsing(b'data: {"delta": "hi"}\n\n')


# What the search looks for, as the regular expression it replaced said it.
WORTH_PARSING = re.compile(rb'"usage"|"error"|"finish_reason"\s*:\s*"')
WORDS = [b'"usage"', b'"error"', b'"finish_reason"', b":", b'"', b" ", b"\t", b"\n", b"\r"]
WORDS += [b"\x0b", b"\x0c", b"null", b"x", b'"finish_reason', b'usage"', b"{", b'finish_reason"']


@given(st.lists(st.sampled_from(WORDS), max_size=12))
def test_worth_parsing_is_the_regular_expression(pieces: list[bytes]) -> None:
    event = b"".join(pieces)
    assert _worth_parsing(event) == (WORTH_PARSING.search(event) is not None)


def test_a_finish_reason_after_much_space_is_still_found() -> None:
    event = b'data: {"finish_reason"' + b" " * 100_000 + b': "stop"}\n\n'
    assert _worth_parsing(event)
    assert not _worth_parsing(event.replace(b'"stop"', b"null"))


def test_a_finish_reason_beginning_at_the_last_ones_closing_quote_is_found() -> None:
    assert _worth_parsing(b'"finish_reason"finish_reason":"x')
