"""Plain and JSON log lines, and the request id on every record made during a request."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TextIO

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slm_server.logging_setup import (
    HOLD_BYTES,
    REQUEST_ID,
    JsonFormatter,
    PlainFormatter,
    RequestIdFilter,
    Stamps,
    bind_to_loop,
    configure,
    direct_line_handler,
    utc_stamp,
)

CREATED = 1_796_030_042.117  # 2026-11-30T09:14:02.117Z


def make(message: str = "hello %s", args: Any = ("world",), **extra: Any) -> logging.LogRecord:
    record = logging.LogRecord("slm_server.router", logging.INFO, __file__, 1, message, args, None)
    record.created = CREATED
    for key, value in extra.items():
        setattr(record, key, value)
    return record


def test_utc_stamp() -> None:
    assert utc_stamp(CREATED) == "2026-11-30T09:14:02.117Z"


def test_plain_lines_keep_the_stamp_and_add_the_request_id() -> None:
    formatter = PlainFormatter("router")
    assert formatter.format(make()) == "2026-11-30T09:14:02.117Z [router] INFO hello world"
    line = formatter.format(make(request_id="r-1"))
    assert line == "2026-11-30T09:14:02.117Z [router] INFO hello world request_id=r-1"


def test_plain_lines_carry_tracebacks() -> None:
    try:
        raise ValueError("bad")
    except ValueError:
        record = make()
        record.exc_info = sys.exc_info()
    text = PlainFormatter("backends").format(record)
    assert text.splitlines()[0].endswith("[backends] INFO hello world")
    assert "ValueError: bad" in text


def test_json_lines_hold_every_field() -> None:
    record = make(request_id="r-2", status=200, model="alpha", path="/v1/x", thing=object())
    entry = json.loads(JsonFormatter("router").format(record))
    assert entry["ts"] == "2026-11-30T09:14:02.117Z"
    assert entry["level"] == "INFO"
    assert entry["logger"] == "slm_server.router"
    assert entry["process"] == "router"
    assert entry["message"] == "hello world"
    assert entry["request_id"] == "r-2"
    assert (entry["status"], entry["model"], entry["path"]) == (200, "alpha", "/v1/x")
    assert entry["thing"].startswith("<object object")
    assert "args" not in entry and "msg" not in entry and "exc_info" not in entry


def test_json_lines_carry_exceptions_in_one_line() -> None:
    try:
        raise ValueError("bad")
    except ValueError:
        record = make()
        record.exc_info = sys.exc_info()
    line = JsonFormatter("router").format(record)
    assert "\n" not in line
    assert "ValueError: bad" in json.loads(line)["exception"]


@given(
    st.text(),
    st.dictionaries(
        st.from_regex(r"[a-z]{1,8}_x", fullmatch=True),
        st.one_of(st.integers(), st.text(), st.floats(allow_nan=False), st.none()),
    ),
)
def test_any_message_and_fields_make_one_json_line(message: str, extra: dict[str, Any]) -> None:
    line = JsonFormatter("router").format(make("%s", (message,), **extra))
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["message"] == message
    assert {key: entry[key] for key in extra} == extra


def test_the_filter_copies_the_request_id_from_the_context() -> None:
    quiet = make()
    RequestIdFilter().filter(quiet)
    assert getattr(quiet, "request_id", "unset") is None
    token = REQUEST_ID.set("ctx-1")
    try:
        inside = make()
        RequestIdFilter().filter(inside)
        assert getattr(inside, "request_id", None) == "ctx-1"
    finally:
        REQUEST_ID.reset(token)


@pytest.fixture
def restored_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.usefixtures("restored_root")
@pytest.mark.parametrize("json_lines", [False, True])
def test_configure_sends_records_to_the_stream(json_lines: bool) -> None:
    stream = io.StringIO()
    configure("backends", json_lines, stream)
    token = REQUEST_ID.set("ctx-2")
    try:
        logging.getLogger("slm_server.supervise").info("started %d", 3)
    finally:
        REQUEST_ID.reset(token)
    [line] = stream.getvalue().splitlines()
    if json_lines:
        entry = json.loads(line)
        assert (entry["message"], entry["process"], entry["request_id"]) == (
            "started 3",
            "backends",
            "ctx-2",
        )
    else:
        pattern = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z \[backends\] INFO started 3"
        assert re.fullmatch(pattern + " request_id=ctx-2", line)
    assert logging.getLogger("httpx").level == logging.WARNING


@given(st.floats(min_value=0, max_value=4_000_000_000, allow_nan=False))
def test_stamps_are_utc_stamp(created: float) -> None:
    stamp = Stamps()
    assert stamp(created) == utc_stamp(created)
    assert stamp(created + 0.5) == utc_stamp(created + 0.5)
    assert stamp(created) == utc_stamp(created)


@pytest.mark.usefixtures("restored_root")
def test_records_made_after_configure_skip_thread_and_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for flag in ("logThreads", "logProcesses", "logMultiprocessing"):
        monkeypatch.setattr(logging, flag, True)
    configure("router", json_lines=True, stream=io.StringIO())
    record = make()
    assert record.process is None and record.thread is None and record.processName is None


class Flushed(io.TextIOWrapper):
    """A text stream whose bytes reach ``written`` only when flushed."""

    def __init__(self) -> None:
        self.raw_bytes = io.BytesIO()
        super().__init__(self.raw_bytes, encoding="utf-8", write_through=False)

    @property
    def written(self) -> str:
        return self.raw_bytes.getvalue().decode()


@pytest.mark.usefixtures("restored_root")
@pytest.mark.parametrize("json_lines", [False, True])
def test_a_direct_line_is_the_line_the_record_would_have_made(json_lines: bool) -> None:
    stream = io.StringIO()
    handler = configure("router", json_lines, stream)
    access = logging.getLogger("slm_server.access")
    assert direct_line_handler(access, logging.INFO) is handler
    fields = {"method": "POST", "status": 200, "model": None, "duration_ms": 1.5}
    handler.write_line(
        handler.lines.line(CREATED, "INFO", access.name, "POST /x 200", "r-9", fields),
        logging.INFO,
    )
    record = logging.LogRecord(access.name, logging.INFO, __file__, 0, "POST /x 200", (), None)
    record.created = CREATED
    record.request_id = "r-9"
    for key, value in fields.items():
        setattr(record, key, value)
    handler.handle(record)
    direct, made = stream.getvalue().splitlines()
    assert direct == made


@pytest.mark.usefixtures("restored_root")
def test_no_direct_line_when_anything_else_would_see_the_record() -> None:
    handler = configure("router", False, io.StringIO())
    access = logging.getLogger("slm_server.access")
    assert direct_line_handler(access, logging.DEBUG) is None  # the level is off
    extra = logging.Handler()
    logging.root.addHandler(extra)  # a test's capture, say
    assert direct_line_handler(access, logging.INFO) is None
    logging.root.removeHandler(extra)
    access.addFilter(RequestIdFilter())
    assert direct_line_handler(access, logging.INFO) is None
    access.removeFilter(access.filters[0])
    assert direct_line_handler(access, logging.INFO) is handler
    parent = logging.getLogger("slm_server")  # a logger on the way passes records on
    assert access.parent is parent
    assert direct_line_handler(access, logging.INFO) is handler
    parent.addHandler(extra)  # ... unless it has a handler of its own
    assert direct_line_handler(access, logging.INFO) is None
    parent.removeHandler(extra)


@pytest.mark.usefixtures("restored_root")
def test_info_lines_on_the_bound_loop_are_flushed_together_soon_and_warnings_at_once() -> None:
    stream = Flushed()
    handler = configure("router", False, stream)
    log = logging.getLogger("slm_server.router")

    async def scenario() -> None:
        bind_to_loop(asyncio.get_running_loop())
        try:
            log.info("first")
            log.info("second")
            assert stream.written == ""  # not yet: one write for both, soon
            deadline = time.monotonic() + 5
            while "second" not in stream.written:
                assert time.monotonic() < deadline, "the lines were never flushed"
                await asyncio.sleep(0.01)
            assert stream.written.count("\n") == 2
            log.warning("trouble")
            assert "trouble" in stream.written  # at once
            log.info("third")
            worker = threading.Thread(target=log.info, args=("from a thread",))
            worker.start()
            worker.join(5)
            assert "from a thread" in stream.written  # another thread's line: at once
        finally:
            bind_to_loop(None)

    asyncio.run(scenario())
    assert "third" in stream.written  # unbinding flushes what was pending
    assert handler.stream is stream


class Unbuffered(io.TextIOWrapper):
    """A stream like stdout under ``PYTHONUNBUFFERED``: every write reaches the file,
    each one a write of its own (counted)."""

    def __init__(self) -> None:
        self.raw_bytes = io.BytesIO()
        self.writes = 0
        super().__init__(self.raw_bytes, encoding="utf-8", write_through=True)

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)

    @property
    def written(self) -> str:
        return self.raw_bytes.getvalue().decode()


def router_logging(stream: TextIO) -> logging.Logger:
    """The router's logging configured onto ``stream``: its logger."""
    configure("router", False, stream)
    return logging.getLogger("slm_server.router")


def on_a_bound_loop(scenario: Callable[[], Awaitable[None]]) -> None:
    """Run ``scenario`` on an event loop the handler is bound to; unbinding afterwards
    writes what is still held."""

    async def bound() -> None:
        bind_to_loop(asyncio.get_running_loop())
        try:
            await scenario()
        finally:
            bind_to_loop(None)

    asyncio.run(bound())


@pytest.mark.usefixtures("restored_root")
def test_lines_held_for_the_timer_are_one_write_even_on_an_unbuffered_stream() -> None:
    stream = Unbuffered()
    log = router_logging(stream)

    async def scenario() -> None:
        for n in range(5):
            log.info("line %d", n)
        assert stream.written == ""  # held, whatever the stream's own buffering
        deadline = time.monotonic() + 5
        while "line 4" not in stream.written:
            assert time.monotonic() < deadline, "the lines were never written"
            await asyncio.sleep(0.01)
        assert stream.writes == 1
        log.info("held")
        log.warning("trouble")  # at once, after the line held before it
        assert stream.written.index("held") < stream.written.index("trouble")

    on_a_bound_loop(scenario)


class Picky(Unbuffered):
    """A stream that cannot take some characters (as a non-UTF-8 stdout cannot)."""

    def write(self, text: str) -> int:
        if "\N{SNOWMAN}" in text:
            raise UnicodeEncodeError("ascii", text, 0, 1, "not here")
        return super().write(text)


@pytest.mark.usefixtures("restored_root")
def test_a_line_the_stream_cannot_take_loses_only_itself() -> None:
    stream = Picky()
    log = router_logging(stream)

    async def scenario() -> None:
        log.info("before")
        log.info("snow \N{SNOWMAN}")
        log.info("after")

    on_a_bound_loop(scenario)  # unbinding writes what was held
    assert "before" in stream.written and "after" in stream.written
    assert "snow" not in stream.written


@pytest.mark.usefixtures("restored_root")
def test_held_lines_past_the_limit_are_written_without_waiting() -> None:
    stream = Unbuffered()
    log = router_logging(stream)

    async def scenario() -> None:
        line = "x" * 1000
        for _ in range(HOLD_BYTES // 1000 + 1):
            log.info(line)
        assert stream.writes == 1  # the limit passed: written, no timer waited for

    on_a_bound_loop(scenario)


@pytest.mark.usefixtures("restored_root")
def test_lines_are_flushed_at_once_when_no_loop_is_bound() -> None:
    stream = Flushed()
    configure("backends", False, stream)
    logging.getLogger("slm_server.supervise").info("started")
    assert "started" in stream.written
