"""A client that asks and never reads is cut off after ``write_stall_seconds``: driven
in-process through the real door protocol on a transport whose peer reads nothing
(it asks the protocol to pause writing past a high-water mark, as asyncio's and
uvloop's transports do, and resumes only when the test says the peer read)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from starlette.types import Receive, Scope, Send

from slm_server.settings import DoorLimits
from tests.unit.router.door_client import Unread, door_for

STALL = 0.05
REQUEST = b"GET / HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n"
PIECE = b"x" * 16 * 1024


async def run_app(app: Any, transport: Unread, stall: float = STALL) -> float:
    """Serve one request with ``app``; the seconds it took to end."""
    protocol = door_for(app, transport, DoorLimits(write_stall_seconds=stall))
    started = time.monotonic()
    protocol.data_received(REQUEST)
    await asyncio.wait_for(asyncio.gather(*protocol.tasks), 5.0)
    return time.monotonic() - started


def test_a_stream_to_a_client_that_reads_nothing_is_cut_after_the_write_stall() -> None:
    transport = Unread()
    sent = 0

    async def stream(scope: Scope, receive: Receive, send: Send) -> None:
        nonlocal sent
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for _ in range(1000):  # blocks once the buffer is full, until the door cuts
            await send({"type": "http.response.body", "body": PIECE, "more_body": True})
            sent += 1
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    took = asyncio.run(run_app(stream, transport))
    assert transport.aborted_at is not None, "the connection was never cut"
    assert STALL <= took < 2.0
    assert transport.buffered == 0


def test_a_whole_answer_left_in_the_buffer_is_dropped_after_the_write_stall() -> None:
    """The response is complete, but a close would wait for a peer that never reads:
    the door aborts instead, and the buffered answer goes with the connection."""
    transport = Unread()

    async def whole(scope: Scope, receive: Receive, send: Send) -> None:
        body = PIECE * 64  # 1 MiB, past the high-water mark
        headers = [(b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def run() -> None:
        await run_app(whole, transport)
        assert transport.aborted_at is None  # the answer is handed over; the timer runs
        deadline = time.monotonic() + 5.0
        while transport.aborted_at is None and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    asyncio.run(run())
    assert transport.aborted_at is not None
    assert transport.buffered == 0


def test_a_client_that_reads_again_within_the_limit_is_never_cut() -> None:
    transport = Unread()
    stall = 0.2

    async def stream(scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for _ in range(40):
            await send({"type": "http.response.body", "body": PIECE, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def reader() -> None:
        # Reads now and then, each time well within the limit; 0.6 s in all, three
        # times the limit.
        for _ in range(12):
            await asyncio.sleep(stall / 4)
            transport.read_by_peer()

    async def run() -> None:
        reading = asyncio.ensure_future(reader())
        await run_app(stream, transport, stall)
        await reading
        await asyncio.sleep(stall * 1.5)  # past the limit, with nothing paused

    asyncio.run(run())
    assert transport.aborted_at is None
