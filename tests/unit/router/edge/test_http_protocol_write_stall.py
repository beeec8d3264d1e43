"""A client that asks and never reads is cut off after ``write_stall_seconds``, however
the connection otherwise ends (a refusal's close, a pipelined request behind a stream),
and a slow reader that keeps reading never is. Driven in-process through the real door
protocol on transports whose peer reads nothing (:class:`Unread`: it asks the protocol
to pause writing past a high-water mark, as asyncio's and uvloop's transports do, and
resumes only when the test says the peer read) or reads part of the buffer at a time
(:class:`Draining`). The four tests found by a hostile review each failed before its
fix; the same review's other scenarios follow them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.types import Receive, Scope, Send

from slm_server.errors import GatewayError
from slm_server.router.answer.stream_relay import StreamRelay
from slm_server.settings import DoorLimits
from tests.unit.router.door_client import Unread, door_for

STALL = 0.05
REQUEST = b"GET / HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n"
PIECE = b"x" * 16 * 1024


class Draining(Unread):
    """:class:`Unread` with asyncio's low-water mark (a quarter of the high one): the
    peer may take part of the buffer, and writing resumes only once the buffer is below
    the low-water mark, as asyncio's and uvloop's transports do. ``close`` with bytes
    still buffered waits for them (connection_lost only once they are taken)."""

    LOW_WATER = Unread.HIGH_WATER // 4

    def __init__(self) -> None:
        super().__init__()
        self.lost = False

    def take(self, n: int) -> None:
        """The peer read ``n`` bytes."""
        if self.aborted_at is not None:
            return
        self.buffered = max(0, self.buffered - n)
        if self.paused and self.buffered <= self.LOW_WATER:
            self.paused = False
            self.protocol.resume_writing()
        if self.closed and not self.buffered and not self.lost:
            self.lost = True
            self.protocol.connection_lost(None)

    def abort(self) -> None:
        if self.aborted_at is None and not self.lost:
            self.lost = True
            super().abort()


async def run_app(app: Any, transport: Unread, stall: float = STALL) -> float:
    """Serve one request with ``app``; the seconds it took to end."""
    protocol = door_for(app, transport, DoorLimits(write_stall_seconds=stall))
    started = time.monotonic()
    protocol.data_received(REQUEST)
    await asyncio.wait_for(asyncio.gather(*protocol.tasks), 5.0)
    return time.monotonic() - started


async def until(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.005)
    return True


def whole_app(size: int) -> Any:
    async def whole(scope: Scope, receive: Receive, send: Send) -> None:
        body = b"x" * size
        headers = [(b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return whole


def watching_stream(heard: list[float]) -> Any:
    """A stream that runs until its receive() says the client left (0.8 s at most)."""

    async def stream(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()  # the (empty) body
        gone = asyncio.Event()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            heard.append(time.monotonic())
            gone.set()

        watcher = asyncio.ensure_future(watch())
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        started = time.monotonic()
        while not gone.is_set() and time.monotonic() - started < 0.8:
            await send({"type": "http.response.body", "body": PIECE, "more_body": True})
            await asyncio.sleep(0.001)
        watcher.cancel()
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return stream


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


# -- found by a hostile review (each failed before its fix) ----------------------------


def test_a_steady_slow_reader_of_a_large_whole_answer_is_not_cut() -> None:
    """The peer reads 64 KiB every quarter of the stall, without a pause: it takes the
    1 MiB answer in about four stall periods. A reader that keeps reading must never be
    cut, but pause→resume only happens below the low-water mark, i.e. once nearly the
    whole answer is taken."""
    stall = 0.1
    transport = Draining()

    async def run() -> None:
        door_for(whole_app(1024 * 1024), transport, DoorLimits(write_stall_seconds=stall))
        transport.protocol.data_received(REQUEST)
        await asyncio.gather(*transport.protocol.tasks)  # the answer is handed over
        assert transport.paused
        started = time.monotonic()
        while transport.buffered and time.monotonic() - started < 3.0:
            await asyncio.sleep(stall / 4)
            transport.take(64 * 1024)
        await asyncio.sleep(0)

    asyncio.run(run())
    assert transport.aborted_at is None, "a client reading steadily was cut mid-answer"


def test_a_non_reader_whose_next_head_times_out_is_still_cut() -> None:
    """Ask for a large answer and pipeline half of the next head, then read nothing:
    the head timer answers 408 through ``_answer_and_close``, whose ``_cancel_all``
    cancels the write-stall alarm; the close then waits for a drain that never comes,
    holding the connection and the buffered answer for ever."""
    transport = Draining()
    stall = 0.15

    async def run() -> None:
        door_for(
            whole_app(1024 * 1024),
            transport,
            DoorLimits(write_stall_seconds=stall, header_timeout_seconds=0.05),
        )
        transport.protocol.data_received(REQUEST + b"GET / HTTP/1.1\r\nhost: 1")
        assert await until(lambda: transport.paused, 1.0)
        assert await until(lambda: transport.closed, 1.0)  # the 408 and the close
        await until(lambda: transport.aborted_at is not None, stall + 0.5)

    asyncio.run(run())
    assert transport.aborted_at is not None, "a closing connection nobody reads is held"


def test_a_pipelined_stream_learns_that_its_client_was_cut() -> None:
    """A stream with a second request pipelined behind it, nothing read: the cut comes,
    but uvicorn's ``connection_lost`` marks only ``self.cycle`` (the queued request's)
    disconnected. The running stream never hears of it (its ``receive`` never says
    ``http.disconnect``, its sends go on into a dead transport, no longer paused): it
    keeps its task, its backend and its admission slot until the backend ends or the
    deadline."""
    transport = Unread()
    stall = 0.1
    heard: list[float] = []
    stream = watching_stream(heard)

    async def run() -> None:
        protocol = door_for(stream, transport, DoorLimits(write_stall_seconds=stall))
        protocol.data_received(REQUEST + REQUEST)
        await asyncio.wait_for(asyncio.gather(*protocol.tasks), 5.0)

    asyncio.run(run())
    assert transport.aborted_at is not None  # the cut itself comes
    assert heard, "the running stream never heard its client was cut"
    assert heard[0] - transport.aborted_at < 0.2


def test_a_non_reader_whose_body_stalls_mid_answer_is_still_cut() -> None:
    """A non-reader whose request body stalls after a large (early) answer began: the
    body timer's ``_answer_and_close`` just closes (the response has begun) after
    ``_cancel_all`` cancelled the write-stall alarm, and the close waits for a drain
    that never comes. Same root as the head-timeout case."""
    stall = 0.15
    transport = Draining()

    async def early(scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for _ in range(8):  # past the high-water mark; then waits for the drain
            await send({"type": "http.response.body", "body": PIECE, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def run() -> None:
        protocol = door_for(
            early, transport, DoorLimits(write_stall_seconds=stall, body_stall_seconds=0.05)
        )
        protocol.data_received(
            b"POST / HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: 100\r\n\r\nab"
        )
        assert await until(lambda: transport.paused, 1.0)
        assert await until(lambda: transport.closed, 1.0)  # the body stall's close
        await until(lambda: transport.aborted_at is not None, stall + 0.5)

    asyncio.run(run())
    assert transport.aborted_at is not None, "a closing connection nobody reads is held"


# -- the same review's scenarios, which held up ----------------------------------------


def test_a_pause_resume_pause_cycle_rearms_the_alarm_from_the_last_pause() -> None:
    """pause, resume just before the deadline, pause again: the cut comes one stall
    after the second pause (the Alarm moves its timer later by re-arming on fire)."""
    stall = 0.1
    transport = Unread()
    marks: dict[str, float] = {}

    async def run() -> None:
        protocol = door_for(whole_app(10), transport, DoorLimits(write_stall_seconds=stall))
        protocol.data_received(REQUEST)
        await asyncio.gather(*protocol.tasks)
        protocol.pause_writing()
        await asyncio.sleep(stall * 0.8)
        protocol.resume_writing()
        protocol.pause_writing()
        marks["second"] = time.monotonic()
        await until(lambda: transport.aborted_at is not None, stall * 5)

    asyncio.run(run())
    assert transport.aborted_at is not None
    assert transport.aborted_at - marks["second"] >= stall - 0.01


def test_resumed_just_in_time_then_never_paused_again_is_never_cut() -> None:
    stall = 0.05
    transport = Unread()

    async def run() -> None:
        protocol = door_for(whole_app(10), transport, DoorLimits(write_stall_seconds=stall))
        protocol.data_received(REQUEST)
        await asyncio.gather(*protocol.tasks)
        for _ in range(5):
            protocol.pause_writing()
            await asyncio.sleep(stall / 2)
            protocol.resume_writing()
        await asyncio.sleep(stall * 3)

    asyncio.run(run())
    assert transport.aborted_at is None


def test_a_keep_alive_request_after_a_drained_pause_is_served() -> None:
    """A pause in the first answer, drained; the next request on the connection is
    answered whole and nothing is cut later."""
    stall = 0.05
    transport = Unread()

    async def run() -> None:
        protocol = door_for(whole_app(256 * 1024), transport, DoorLimits(write_stall_seconds=stall))
        protocol.data_received(REQUEST)
        await asyncio.gather(*protocol.tasks)
        await asyncio.sleep(0)
        assert transport.paused
        transport.read_by_peer()
        protocol.data_received(REQUEST)
        await asyncio.gather(*protocol.tasks)
        await asyncio.sleep(0)
        transport.read_by_peer()
        await asyncio.sleep(stall * 3)

    asyncio.run(run())
    assert transport.aborted_at is None


def test_a_pause_while_the_next_head_arrives_slowly_is_still_cut() -> None:
    """The client dribbles the next head (the head timer is long) and reads nothing:
    the write alarm, separate from the head's, still cuts."""
    stall = 0.05
    transport = Unread()

    async def run() -> None:
        protocol = door_for(
            whole_app(1024 * 1024),
            transport,
            DoorLimits(write_stall_seconds=stall, header_timeout_seconds=5),
        )
        protocol.data_received(REQUEST)
        await asyncio.gather(*protocol.tasks)
        for byte in b"GET / HT":
            protocol.data_received(bytes([byte]))
            await asyncio.sleep(stall / 10)
        await until(lambda: transport.aborted_at is not None, 1.0)

    asyncio.run(run())
    assert transport.aborted_at is not None


def test_a_connection_closed_idle_with_its_answer_unread_is_still_cut() -> None:
    """The idle timer (sooner than the stall here) closes the transport gracefully; the
    close waits for the buffer, and the write alarm still aborts it."""
    stall = 0.15
    transport = Draining()

    async def run() -> None:
        protocol = door_for(
            whole_app(1024 * 1024),
            transport,
            DoorLimits(write_stall_seconds=stall, idle_timeout_seconds=0.03),
        )
        protocol.data_received(REQUEST)
        await asyncio.gather(*protocol.tasks)
        assert await until(lambda: transport.closed, 1.0)
        await until(lambda: transport.aborted_at is not None, 1.0)

    asyncio.run(run())
    assert transport.aborted_at is not None


def test_no_abort_after_the_client_itself_went_away() -> None:
    stall = 0.05
    transport = Unread()

    async def run() -> None:
        protocol = door_for(
            whole_app(1024 * 1024), transport, DoorLimits(write_stall_seconds=stall)
        )
        protocol.data_received(REQUEST)
        await asyncio.gather(*protocol.tasks)
        assert transport.paused
        protocol.connection_lost(ConnectionResetError())
        await asyncio.sleep(stall * 3)

    asyncio.run(run())
    assert transport.aborted_at is None


def test_a_stream_relay_cut_by_the_stall_is_a_client_leaving_not_a_backend_failure() -> None:
    """Through the router's StreamRelay (the chunk path): the cut ends the relay as a
    client that left (no on_cut, no in-band error), and ``close`` (backend response and
    admission slot) runs."""
    stall = 0.05
    transport = Unread()
    closed: list[float] = []
    cuts: list[GatewayError] = []

    async def chunks() -> AsyncIterator[bytes]:
        while True:
            yield PIECE
            await asyncio.sleep(0)

    async def close() -> None:
        closed.append(time.monotonic())

    relay = StreamRelay(chunks(), close, deadline=time.monotonic() + 60, on_cut=cuts.append)

    async def run() -> None:
        # The relay's deadline is loop time: set far away.
        relay.deadline = asyncio.get_running_loop().time() + 60
        protocol = door_for(relay, transport, DoorLimits(write_stall_seconds=stall))
        protocol.data_received(REQUEST)
        await asyncio.wait_for(asyncio.gather(*protocol.tasks), 2.0)

    asyncio.run(run())
    assert transport.aborted_at is not None
    assert closed and closed[0] - transport.aborted_at < 0.2
    assert cuts == []


def test_a_stream_alone_on_its_connection_hears_the_cut() -> None:
    """The control for the pipelined case: without a request queued behind it, the
    stream's receive() says http.disconnect right after the cut."""
    transport = Unread()
    heard: list[float] = []

    async def run() -> None:
        protocol = door_for(watching_stream(heard), transport, DoorLimits(write_stall_seconds=0.1))
        protocol.data_received(REQUEST)
        await asyncio.wait_for(asyncio.gather(*protocol.tasks), 5.0)

    asyncio.run(run())
    assert transport.aborted_at is not None
    assert heard and heard[0] - transport.aborted_at < 0.2
