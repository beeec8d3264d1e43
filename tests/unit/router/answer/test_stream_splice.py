"""The stream splice: a backend's pieces written to the client from the upstream
connection's own callbacks, with every duty of the piece-by-piece relay kept. Real
backends on local ports (the router's HTTP client talks to them); the client's side is
a recording writer standing in for the door's writer."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar, cast

import pytest
import uvloop

from slm_server.contracts.verdicts import Outcome, Verdict
from slm_server.errors import AnswerTooLarge, BackendProtocolError, BackendTimeout
from slm_server.http1 import Pool, Response
from slm_server.registry.schema import ModelSpec
from slm_server.router.answer.stream_splice import Splice
from slm_server.router.apis.table import TABLE
from slm_server.router.call.exchange import Exchange
from slm_server.router.call.fast_path import PieceWriter
from slm_server.router.upstream.sse import SseTap
from slm_server.router.watchdog.tripwire import Progress, StallTimer
from tests.unit.test_http1 import Peer, Server, chunked, poll, spec_at

CHAT_PATH = "/v1/chat/completions"

T = TypeVar("T")


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Callable[[Coroutine[Any, Any, T]], T]:
    runner: Callable[[Coroutine[Any, Any, T]], T] = (
        asyncio.run if request.param == "asyncio" else uvloop.run
    )
    return runner


STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)


def event(n: int) -> bytes:
    chunk = {"choices": [{"index": 0, "delta": {"content": str(n)}}]}
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


class Writer:
    """The client's side: every piece written, and a write buffer the test fills."""

    def __init__(self) -> None:
        self.pieces: list[bytes] = []
        self.full = False
        self.drained = asyncio.Event()
        self.drains = 0

    def write(self, body: bytes) -> bool:
        self.pieces.append(body)
        return True

    async def drain(self) -> None:
        self.drains += 1
        await self.drained.wait()


class Watchdog:
    """The tripwire's ``observe``, recorded."""

    def __init__(self) -> None:
        self.seen: list[Outcome] = []

    def observe(self, spec: ModelSpec, outcome: Outcome, detail: str | None = None) -> None:
        self.seen.append(outcome)


class Stalls:
    def __init__(self) -> None:
        self.cleared = 0

    def first_byte(self) -> None:
        self.cleared += 1

    def cancel(self) -> None:
        pass


async def open_stream(server: Server, read_timeout: float = 5.0) -> tuple[Pool, Response]:
    pool = Pool(server.url, connect_timeout=2.0, read_timeout=read_timeout)
    return pool, await pool.request("POST", "/v1/chat/completions", None, b"{}")


def splice_of(
    response: Response, *, hidden_usage: bool = False, max_event: int = 1 << 20
) -> tuple[Splice, Exchange, Progress, Watchdog, Stalls]:
    exchange = Exchange("r", "POST", CHAT_PATH, shape=TABLE.at(CHAT_PATH))
    progress = Progress(0.0)
    watchdog, stalls = Watchdog(), Stalls()
    tap = SseTap(exchange, drop_usage_chunk=hidden_usage, max_event_bytes=max_event)
    splice = Splice(
        spec_at(1),
        exchange,
        response,
        tap,
        cast(StallTimer, stalls),
        progress,
        cast(Any, watchdog),
    )
    return splice, exchange, progress, watchdog, stalls


def direct(writer: Writer) -> PieceWriter:
    return writer


def test_pieces_reach_the_client_in_order_and_are_noted(run: Any) -> None:
    events = [event(n) for n in range(20)]

    async def backend(peer: Peer) -> None:
        await peer.request()
        peer.send(STREAM_HEAD)
        for e in events:
            peer.send(chunked(e))
            await peer.writer.drain()
        peer.send(chunked(b'data: {"choices":[{"index":0,"finish_reason":"stop","delta":{}}]}\n\n'))
        peer.send(b"0\r\n\r\n")
        await peer.wait_eof()

    async def scenario() -> None:
        async with Server(backend) as server:
            pool, response = await open_stream(server)
            splice, exchange, progress, watchdog, stalls = splice_of(response)
            writer = Writer()
            await splice.run(direct(writer))
            text = b"".join(writer.pieces)
            assert text.startswith(b"".join(events))
            assert exchange.finish_reasons == ["stop"]
            assert exchange.chunks >= 1 and exchange.first_chunk is not None
            assert stalls.cleared == 1
            assert [o.verdict for o in watchdog.seen] == [Verdict.HEALTH]
            assert progress.delivered
            assert response.closed
            # Kept alive for the next request, with nothing of this reader left on it.
            [idle] = cast(Any, pool)._idle
            assert idle.sink is None and not idle.paused
            pool.close()

    run(scenario())


def test_the_chunks_of_one_read_go_out_in_one_write(run: Any) -> None:
    go = asyncio.Event()
    burst = [event(n) for n in range(50)]

    async def backend(peer: Peer) -> None:
        await peer.request()
        peer.send(STREAM_HEAD)
        await go.wait()
        peer.send(b"".join(chunked(e) for e in burst) + b"0\r\n\r\n")  # one write
        await peer.wait_eof()

    async def scenario() -> None:
        async with Server(backend) as server:
            pool, response = await open_stream(server)
            splice, *_ = splice_of(response)
            writer = Writer()
            task = asyncio.create_task(splice.run(direct(writer)))
            go.set()
            await asyncio.wait_for(task, 5)
            assert b"".join(writer.pieces) == b"".join(burst)
            assert len(writer.pieces) < 10  # a write per read, not per chunk (50)
            pool.close()

    run(scenario())


def test_a_usage_chunk_the_router_asked_for_is_kept_from_the_client(run: Any) -> None:
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\n'

    async def backend(peer: Peer) -> None:
        await peer.request()
        peer.send(STREAM_HEAD + chunked(event(1)) + chunked(usage) + chunked(b"data: [DONE]\n\n"))
        peer.send(b"0\r\n\r\n")
        await peer.wait_eof()

    async def scenario() -> None:
        async with Server(backend) as server:
            pool, response = await open_stream(server)
            splice, exchange, *_ = splice_of(response, hidden_usage=True)
            writer = Writer()
            await splice.run(direct(writer))
            assert b"".join(writer.pieces) == event(1) + b"data: [DONE]\n\n"
            assert (exchange.input_tokens, exchange.output_tokens) == (3, 2)
            pool.close()

    run(scenario())


def test_a_body_cut_short_counts_against_the_backend(run: Any) -> None:
    async def backend(peer: Peer) -> None:
        await peer.request()
        peer.send(STREAM_HEAD + chunked(event(1)))
        await peer.writer.drain()
        peer.writer.transport.abort()

    async def scenario() -> None:
        async with Server(backend) as server:
            pool, response = await open_stream(server)
            splice, exchange, _progress, watchdog, _stalls = splice_of(response)
            writer = Writer()
            with pytest.raises(BackendProtocolError):
                await splice.run(direct(writer))
            assert b"".join(writer.pieces) == event(1)
            assert exchange.error_type == BackendProtocolError.default_code
            assert [o.verdict for o in watchdog.seen] == [Verdict.HEALTH, Verdict.FAILURE]
            pool.close()

    run(scenario())


def test_steady_pieces_never_time_out_but_a_silence_does(run: Any) -> None:
    """The read timeout bounds each wait for the next bytes, not the whole stream."""
    read_timeout = 0.3

    async def steady(peer: Peer) -> None:
        await peer.request()
        peer.send(STREAM_HEAD)
        for n in range(12):  # 12 times 0.06 s: twice the read timeout in all
            peer.send(chunked(event(n)))
            await asyncio.sleep(0.06)
        peer.send(b"0\r\n\r\n")
        await peer.wait_eof()

    async def falls_silent(peer: Peer) -> None:
        await peer.request()
        peer.send(STREAM_HEAD + chunked(event(1)))
        await peer.wait_eof()

    async def scenario() -> None:
        async with Server(steady) as fine, Server(falls_silent) as silent:
            pool, response = await open_stream(fine, read_timeout)
            splice, *_ = splice_of(response)
            writer = Writer()
            await splice.run(direct(writer))
            assert b"".join(writer.pieces) == b"".join(event(n) for n in range(12))
            pool.close()
            pool, response = await open_stream(silent, read_timeout)
            splice, _exchange, _progress, watchdog, _stalls = splice_of(response)
            loop = asyncio.get_running_loop()
            started = loop.time()
            with pytest.raises(BackendTimeout):
                await splice.run(direct(Writer()))
            assert read_timeout - 0.05 <= loop.time() - started < read_timeout + 1.0
            assert watchdog.seen[-1].verdict is Verdict.FAILURE
            pool.close()

    run(scenario())


def test_a_full_client_pauses_the_backend_and_is_not_its_silence(run: Any) -> None:
    go, sent = asyncio.Event(), asyncio.Event()

    async def backend(peer: Peer) -> None:
        await peer.request()
        peer.send(STREAM_HEAD + chunked(event(1)))
        await go.wait()
        for n in range(2, 6):
            peer.send(chunked(event(n)))
        peer.send(b"0\r\n\r\n")
        await peer.writer.drain()
        sent.set()
        await peer.wait_eof()

    async def scenario() -> None:
        async with Server(backend) as server:
            pool, response = await open_stream(server)
            splice, _exchange, progress, *_ = splice_of(response)
            writer = Writer()
            writer.full = True
            task = asyncio.create_task(splice.run(direct(writer)))
            await poll(lambda: writer.drains == 1, "the splice to wait for the client")
            assert cast(Any, response)._conn.paused  # the backend's socket is not read
            assert writer.pieces == [event(1)]
            # The router holds the answer up, not the backend.
            assert progress.silence(1e9) == 0.0
            go.set()
            await sent.wait()
            assert writer.pieces == [event(1)]
            writer.full = False
            writer.drained.set()
            await asyncio.wait_for(task, 5)
            assert b"".join(writer.pieces) == b"".join(event(n) for n in range(1, 6))
            pool.close()

    run(scenario())


def test_an_event_past_its_limit_ends_the_stream(run: Any) -> None:
    async def backend(peer: Peer) -> None:
        await peer.request()
        peer.send(STREAM_HEAD + chunked(event(1)) + chunked(b"data: " + b"x" * 5000))
        await peer.wait_eof()

    async def scenario() -> None:
        async with Server(backend) as server:
            pool, response = await open_stream(server)
            splice, *_ = splice_of(response, max_event=1024)
            writer = Writer()
            # At once: the backend keeps its connection open and sends nothing more.
            with pytest.raises(AnswerTooLarge):
                await asyncio.wait_for(splice.run(direct(writer)), 2)
            assert b"".join(writer.pieces) == event(1)
            response.close()
            pool.close()

    run(scenario())
