"""The router's HTTP/1.1 client against real asyncio servers on real local ports.

Every test runs on both event loops the router may use (asyncio's and uvloop's). The
servers are scripted per test; tests synchronise on events or poll with deadlines.
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import struct
import subprocess
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest
import uvloop

from slm_server.errors import (
    AnswerTooLarge,
    BackendProtocolError,
    BackendTimeout,
    BackendUnavailable,
)
from slm_server.http1 import (
    HIGH_WATER,
    ConnectError,
    ConnectionClosed,
    Headers,
    InvalidStatus,
    Pool,
    ProtocolError,
    ReadTimeout,
    Response,
)
from slm_server.registry.schema import ModelSpec, parse_registry
from slm_server.router.upstream.client import Upstream, iter_sse, read_all
from tests.registry_entries import model_spec

T = TypeVar("T")
# One read of the socket, at most, on either loop.
READ_SIZE = 256 * 1024


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Callable[[Coroutine[Any, Any, T]], T]:
    runner: Callable[[Coroutine[Any, Any, T]], T] = (
        asyncio.run if request.param == "asyncio" else uvloop.run
    )
    return runner


class Peer:
    """The server's side of one accepted connection."""

    def __init__(self, number: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.number = number
        self.reader = reader
        self.writer = writer
        self.eof = asyncio.Event()

    async def request(self) -> bytes | None:
        """The next request's head and body, or None at EOF."""
        try:
            head = await self.reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            self.eof.set()
            return None
        length = 0
        for line in head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        return head + await self.reader.readexactly(length)

    async def wait_eof(self) -> None:
        """Until the client closes its end."""
        while await self.reader.read(65536):
            pass
        self.eof.set()

    def send(self, data: bytes) -> None:
        self.writer.write(data)


Handler = Callable[[Peer], Awaitable[None]]


class Server:
    """A local server running ``handler`` for every connection."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.peers: list[Peer] = []
        self.requests: list[bytes] = []
        self.tasks: set[asyncio.Task[Any]] = set()
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> Server:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *_exc: object) -> None:
        self.server.close()
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for peer in self.peers:
            peer.writer.transport.abort()
        await asyncio.wait_for(self.server.wait_closed(), 5.0)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        peer = Peer(len(self.peers) + 1, reader, writer)
        self.peers.append(peer)
        try:
            await self.handler(peer)
        except asyncio.CancelledError:
            pass  # the test is over
        finally:
            writer.close()
            self.tasks.discard(task)


def ok(body: bytes, *extra: str) -> bytes:
    head = "".join(f"{h}\r\n" for h in extra)
    return f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n{head}\r\n".encode() + body


def chunked(*pieces: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces)


async def answer_each(peer: Peer, server: Server, reply: Callable[[bytes], bytes]) -> None:
    while (request := await peer.request()) is not None:
        server.requests.append(request)
        peer.send(reply(request))


async def poll(predicate: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


async def read_whole(pool: Pool) -> bytes:
    response = await pool.request("POST", "/", None, b"{}")
    return await response.read()


def pool_for(server: Server, **options: Any) -> Pool:
    options.setdefault("connect_timeout", 2.0)
    options.setdefault("read_timeout", 5.0)
    return Pool(server.url, **options)


def keep_alive_server() -> Server:
    server = Server(lambda peer: answer_each(peer, server, lambda _r: ok(b"hello")))
    return server


# -- framing ------------------------------------------------------------------


def test_a_content_length_body_is_read_whole_with_its_headers(run: Any) -> None:
    async def scenario() -> None:
        async with keep_alive_server() as server:
            pool = pool_for(server)
            response = await pool.request(
                "POST", "/v1/x", {"content-type": "application/json"}, b'{"a": 1}'
            )
            assert response.status_code == 200
            assert response.headers.get("CONTENT-LENGTH") == "5"
            assert response.headers.get("x-missing", "none") == "none"
            assert await response.read() == b"hello"
            [request] = server.requests
            head, _, body = request.partition(b"\r\n\r\n")
            assert head.startswith(b"POST /v1/x HTTP/1.1\r\n")
            assert f"host: 127.0.0.1:{server.port}".encode() in head
            assert b"content-length: 8" in head
            assert b"content-type: application/json" in head
            assert body == b'{"a": 1}'
            pool.close()

    run(scenario())


def test_a_chunked_body_arrives_piece_by_piece(run: Any) -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()
        peer.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        peer.send(chunked(b"one "))
        await go_on.wait()
        peer.send(chunked(b"two") + b"0\r\n\r\n")
        await peer.wait_eof()

    go_on: asyncio.Event

    async def scenario() -> None:
        nonlocal go_on
        go_on = asyncio.Event()
        async with Server(handler) as server:
            pool = pool_for(server)
            response = await pool.request("POST", "/", None, b"{}")
            assert await response.receive() == b"one "
            go_on.set()
            assert await response.receive() == b"two"
            assert await response.receive() == b""
            assert response.closed
            assert pool.idle == 1
            pool.close()

    run(scenario())


def test_a_close_delimited_body_ends_at_eof_and_the_connection_is_not_kept(run: Any) -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()
        peer.send(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\npart one, ")
        await peer.writer.drain()
        peer.send(b"part two")
        await peer.writer.drain()

    async def scenario() -> None:
        async with Server(handler) as server:
            pool = pool_for(server)
            response = await pool.request("GET", "/health")
            assert await response.read() == b"part one, part two"
            assert pool.connections == 0
            pool.close()

    run(scenario())


def test_an_interim_response_is_skipped(run: Any) -> None:
    async def scenario() -> None:
        server = Server(
            lambda peer: answer_each(
                peer, server, lambda _r: b"HTTP/1.1 100 Continue\r\n\r\n" + ok(b"final")
            )
        )
        async with server:
            pool = pool_for(server)
            response = await pool.request("POST", "/", None, b"x")
            assert response.status_code == 200
            assert await response.read() == b"final"
            pool.close()

    run(scenario())


# -- keep-alive -----------------------------------------------------------------


def test_a_connection_is_kept_alive_and_reused(run: Any) -> None:
    async def scenario() -> None:
        async with keep_alive_server() as server:
            pool = pool_for(server)
            for _ in range(3):
                response = await pool.request("POST", "/", None, b"{}")
                assert await response.read() == b"hello"
            assert len(server.requests) == 3
            assert len(server.peers) == 1
            assert pool.connections == 1
            pool.close()

    run(scenario())


def test_connections_in_use_at_once_are_not_capped_and_all_return(run: Any) -> None:
    async def scenario() -> None:
        async with keep_alive_server() as server:
            pool = pool_for(server)
            responses = await asyncio.gather(
                *(pool.request("POST", "/", None, b"{}") for _ in range(20))
            )
            assert len(server.peers) == 20
            for response in responses:
                assert await response.read() == b"hello"
            assert pool.idle == 20
            pool.close()

    run(scenario())


def test_connection_close_from_the_server_is_honoured(run: Any) -> None:
    async def scenario() -> None:
        server = Server(
            lambda peer: answer_each(peer, server, lambda _r: ok(b"bye", "Connection: close"))
        )
        async with server:
            pool = pool_for(server)
            for _ in range(2):
                response = await pool.request("POST", "/", None, b"{}")
                assert await response.read() == b"bye"
                assert pool.connections == 0
            assert len(server.peers) == 2
            pool.close()

    run(scenario())


def test_a_fully_received_response_closed_unread_keeps_its_connection(run: Any) -> None:
    async def scenario() -> None:
        async with keep_alive_server() as server:
            pool = pool_for(server)
            response = await pool.request("POST", "/", None, b"{}")
            await poll(lambda: response.buffered == 5, "the whole body")
            await response.aclose()
            response = await pool.request("POST", "/", None, b"{}")
            assert await response.read() == b"hello"
            assert len(server.peers) == 1
            pool.close()

    run(scenario())


def test_idle_connections_expire_and_are_never_reused(run: Any) -> None:
    async def scenario() -> None:
        async with keep_alive_server() as server:
            pool = pool_for(server, idle_expiry=0.2)
            response = await pool.request("POST", "/", None, b"{}")
            assert await response.read() == b"hello"
            # The server's loop reading the next request sees the pool close it.
            await asyncio.wait_for(server.peers[0].eof.wait(), 5.0)
            assert pool.connections == 0
            response = await pool.request("POST", "/", None, b"{}")
            assert await response.read() == b"hello"
            assert len(server.peers) == 2
            pool.close()

    run(scenario())


def test_an_expired_connection_is_not_taken_even_before_the_sweep(run: Any) -> None:
    async def scenario() -> None:
        async with keep_alive_server() as server:
            pool = pool_for(server, idle_expiry=0.2)
            response = await pool.request("POST", "/", None, b"{}")
            assert await response.read() == b"hello"
            loop = asyncio.get_running_loop()
            # As if the idle expiry had passed with the sweep not yet run.
            later = loop.time() + 0.3
            assert pool._take_idle(later) is None
            assert pool.connections == 0
            pool.close()

    run(scenario())


@pytest.mark.parametrize("how", ["close", "reset"])
def test_a_kept_alive_connection_the_server_closed_is_resent_once(run: Any, how: str) -> None:
    async def handler(peer: Peer) -> None:
        request = await peer.request()
        assert request is not None
        server.requests.append(request)
        if peer.number == 1:
            peer.send(ok(b"first"))
            # The next request on this kept-alive connection is read, never answered.
            again = await peer.request()
            assert again is not None
            server.requests.append(again)
            if how == "reset":
                sock = peer.writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return
        peer.send(ok(b"again"))
        await peer.wait_eof()

    server = Server(handler)

    async def scenario() -> None:
        async with server:
            pool = pool_for(server)
            response = await pool.request("POST", "/", None, b"1")
            assert await response.read() == b"first"
            response = await pool.request("POST", "/", None, b"2")
            assert await response.read() == b"again"
            assert len(server.peers) == 2
            assert [r.rpartition(b"\r\n")[2] for r in server.requests] == [b"1", b"2", b"2"]
            pool.close()

    run(scenario())


def test_a_new_connection_closed_before_answering_is_not_resent(run: Any) -> None:
    async def handler(peer: Peer) -> None:
        request = await peer.request()
        assert request is not None
        server.requests.append(request)

    server = Server(handler)

    async def scenario() -> None:
        async with server:
            pool = pool_for(server)
            with pytest.raises(ConnectionClosed) as caught:
                await pool.request("POST", "/", None, b"{}")
            assert caught.value.before_response
            assert len(server.requests) == 1
            pool.close()

    run(scenario())


# -- failures ------------------------------------------------------------------


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_a_refused_connection_is_a_connect_error(run: Any) -> None:
    async def scenario() -> None:
        pool = Pool(f"http://127.0.0.1:{closed_port()}", connect_timeout=2.0, read_timeout=5.0)
        with pytest.raises(ConnectError, match="refused"):
            await pool.request("POST", "/", None, b"{}")

    run(scenario())


def test_no_answer_within_the_read_timeout(run: Any) -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()
        await peer.wait_eof()

    async def scenario() -> None:
        async with Server(handler) as server:
            pool = pool_for(server, read_timeout=0.2)
            with pytest.raises(ReadTimeout):
                await pool.request("POST", "/", None, b"{}")
            await asyncio.wait_for(server.peers[0].eof.wait(), 5.0)
            assert pool.connections == 0

    run(scenario())


def test_a_body_that_stalls_times_out(run: Any) -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()
        peer.send(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
        await peer.wait_eof()

    async def scenario() -> None:
        async with Server(handler) as server:
            pool = pool_for(server, read_timeout=0.2)
            response = await pool.request("POST", "/", None, b"{}")
            assert await response.receive() == b"abc"
            with pytest.raises(ReadTimeout):
                await response.receive()

    run(scenario())


def test_a_per_request_timeout_replaces_a_longer_armed_one(run: Any) -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()
        peer.send(ok(b"fine"))
        await peer.request()  # never answered
        await peer.wait_eof()

    async def scenario() -> None:
        async with Server(handler) as server:
            pool = pool_for(server, read_timeout=60.0)
            response = await pool.request("GET", "/health")
            assert await response.read() == b"fine"
            started = asyncio.get_running_loop().time()
            with pytest.raises(ReadTimeout):
                await pool.request("GET", "/health", timeout=0.2)
            assert asyncio.get_running_loop().time() - started < 5.0

    run(scenario())


@pytest.mark.parametrize(
    "reply",
    [
        b"this is not http\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: nope\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    ],
)
def test_a_malformed_response_is_a_protocol_error(run: Any, reply: bytes) -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()
        peer.send(reply)
        await peer.wait_eof()

    async def scenario() -> None:
        async with Server(handler) as server:
            pool = pool_for(server)
            with pytest.raises(ProtocolError):
                await read_whole(pool)
            assert pool.connections == 0

    run(scenario())


def test_a_body_cut_short_is_a_protocol_error(run: Any) -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()
        peer.send(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this")

    async def scenario() -> None:
        async with Server(handler) as server:
            pool = pool_for(server)
            response = await pool.request("POST", "/", None, b"{}")
            with pytest.raises(ConnectionClosed) as caught:
                await response.read()
            assert not caught.value.before_response

    run(scenario())


def test_header_injection_is_refused(run: Any) -> None:
    async def scenario() -> None:
        pool = Pool("http://127.0.0.1:1", connect_timeout=1.0, read_timeout=1.0)
        for headers in ({"x-a": "1\r\nx-b: 2"}, {"x-a\r\nx-b": "2"}, {"x a": "1"}):
            with pytest.raises(ValueError, match="header"):
                await pool.request("POST", "/", headers, b"")
        with pytest.raises(ValueError, match="path"):
            await pool.request("POST", "/a b", None, b"")

    run(scenario())


# -- closing early and flow control ---------------------------------------------


def test_closing_a_response_early_closes_the_connection(run: Any) -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()
        peer.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        peer.send(chunked(b"data: 1\n\n"))
        await peer.wait_eof()

    async def scenario() -> None:
        async with Server(handler) as server:
            pool = pool_for(server)
            response = await pool.request("POST", "/", None, b"{}")
            assert await response.receive() == b"data: 1\n\n"
            await response.aclose()
            await asyncio.wait_for(server.peers[0].eof.wait(), 5.0)
            assert pool.connections == 0

    run(scenario())


def test_a_reader_that_does_not_read_holds_back_the_stream(run: Any) -> None:
    total = 16 * 1024 * 1024
    bound = HIGH_WATER + READ_SIZE

    async def handler(peer: Peer) -> None:
        await peer.request()
        peer.send(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % total)
        peer.send(b"x" * total)
        sending.set_result(peer.writer.transport)
        await peer.writer.drain()
        await peer.wait_eof()

    sending: asyncio.Future[asyncio.WriteTransport]

    async def scenario() -> None:
        nonlocal sending
        sending = asyncio.get_running_loop().create_future()
        async with Server(handler) as server:
            pool = pool_for(server)
            response = await pool.request("POST", "/", None, b"{}")
            server_side = await sending
            got = 0
            while got < total:
                wanted = min(HIGH_WATER, total - got)
                await poll(lambda: response.buffered >= wanted, "data")  # noqa: B023
                for _ in range(20):  # room for a reader that ignores the limit to overrun it
                    await asyncio.sleep(0)
                assert response.buffered <= bound
                if got == 0:
                    # Paused: the rest waits in the server, not in the client.
                    assert server_side.get_write_buffer_size() > total // 2
                chunk = await response.receive()
                assert 0 < len(chunk) <= bound
                got += len(chunk)
            assert got == total
            assert await response.receive() == b""
            assert pool.idle == 1
            pool.close()

    run(scenario())


# -- through the Upstream boundary -------------------------------------------------


def spec_at(port: int, timeout: float = 5.0) -> ModelSpec:
    return model_spec(
        "m", "m", port, model_path="models/m.gguf", default_timeout=timeout, quantization="Q4_0"
    )


def test_upstream_translates_failures_into_gateway_errors(run: Any) -> None:
    async def silent(peer: Peer) -> None:
        await peer.request()
        await peer.wait_eof()

    async def garbage(peer: Peer) -> None:
        await peer.request()
        peer.send(b"nonsense\r\n\r\n")
        await peer.wait_eof()

    async def scenario() -> None:
        refused = spec_at(closed_port())
        upstream = Upstream((refused,), 1.0, 0.5)
        with pytest.raises(BackendUnavailable) as unavailable:
            await upstream.open(refused, "/v1/x", b"{}", {})
        assert unavailable.value.status == 503
        assert unavailable.value.retry_after is not None
        probe = await upstream.probe(refused)
        assert probe.status == "unreachable"
        async with Server(silent) as quiet, Server(garbage) as broken:
            slow, bad = spec_at(quiet.port, timeout=0.2), spec_at(broken.port)
            upstream = Upstream((slow,), 1.0, 0.2)
            with pytest.raises(BackendTimeout):
                await upstream.open(slow, "/v1/x", b"{}", {})
            assert (await upstream.probe(slow)).status == "timeout"
            await upstream.aclose()
            upstream = Upstream((bad,), 1.0, 0.5)
            with pytest.raises(BackendProtocolError):
                await upstream.open(bad, "/v1/x", b"{}", {})
            assert (await upstream.probe(bad)).status == "error"
            await upstream.aclose()

    run(scenario())


def test_upstream_reads_sse_lines_split_across_pieces(run: Any) -> None:
    events = [{"n": 1}, {"n": 2, "text": "a: b"}]
    stream = b"".join(b"data: " + json.dumps(e).encode() + b"\r\n\r\n" for e in events)
    stream += b": comment\n\ndata: [DONE]\n\n"
    pieces = [stream[i : i + 7] for i in range(0, len(stream), 7)]

    async def handler(peer: Peer) -> None:
        await peer.request()
        peer.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for piece in pieces:
            peer.send(chunked(piece))
            await peer.writer.drain()
        peer.send(b"0\r\n\r\n")
        await peer.wait_eof()

    async def scenario() -> None:
        async with Server(handler) as server:
            spec = spec_at(server.port)
            upstream = Upstream((spec,), 1.0, 0.5)
            response = await upstream.open(spec, "/v1/x", b"{}", {})
            got = [event async for event in iter_sse(spec, response, 1 << 20)]
            assert got == events
            await response.aclose()
            await upstream.aclose()

    run(scenario())


@pytest.mark.parametrize("status", [0, 99, 600, 700, 999])
def test_a_status_outside_100_to_599_is_invalid(run: Any, status: int) -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()
        peer.send(f"HTTP/1.1 {status:03d} Odd\r\nContent-Length: 2\r\n\r\n{{}}".encode())
        await peer.wait_eof()

    async def scenario() -> None:
        async with Server(handler) as server:
            pool = pool_for(server)
            with pytest.raises(ProtocolError) as raised:
                await read_whole(pool)
            if status >= 100:  # a two-digit status is no HTTP at all to the parser
                assert isinstance(raised.value, InvalidStatus)
                assert raised.value.status == status
            assert pool.connections == 0
            spec = spec_at(server.port)
            upstream = Upstream((spec,), 1.0, 0.5)
            with pytest.raises(BackendProtocolError) as translated:
                await upstream.open(spec, "/v1/x", b"{}", {})
            assert translated.value.status == 502
            if status >= 100:
                assert translated.value.code == "upstream_invalid"
                assert f"status {status}" in str(translated.value)
            await upstream.aclose()

    run(scenario())


def test_ten_thousand_copies_of_one_header_parse_in_linear_time() -> None:
    raw = [(b"X-Dup", b"v" * 10)] * 200_000
    started = time.process_time()
    headers = Headers.parse(raw)
    assert time.process_time() - started < 2.0
    assert headers["x-dup"].count(", ") == 199_999


@pytest.mark.parametrize(
    "head",
    [
        pytest.param(
            b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-H%d: 1\r\n" % i for i in range(300)) + b"\r\n",
            id="too-many-headers",
        ),
        pytest.param(b"HTTP/1.1 200 OK\r\nX-Endless: " + b"e" * 2_000_000, id="endless-header"),
    ],
)
def test_a_response_head_past_the_limits_is_a_protocol_error(run: Any, head: bytes) -> None:
    async def handler(peer: Peer) -> None:
        await peer.request()
        peer.send(head)
        await peer.wait_eof()

    async def scenario() -> None:
        async with Server(handler) as server:
            pool = pool_for(server)
            with pytest.raises(ProtocolError) as raised:
                await read_whole(pool)
            assert "response head" in str(raised.value) or "response headers" in str(raised.value)
            assert pool.connections == 0

    run(scenario())


@pytest.mark.parametrize("complete", [True, False])
@pytest.mark.parametrize(
    ("reply", "limit", "expected"),
    [
        (ok(b"hello"), 5, b"hello"),
        (ok(b"hello"), 4, "too large"),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(b"hel", b"lo"),
            5,
            b"hello",
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(b"hel", b"lo"),
            4,
            "too large",
        ),
    ],
)
def test_upstream_reads_a_whole_answer_within_its_limit(
    run: Any, complete: bool, reply: bytes, limit: int, expected: bytes | str
) -> None:
    """Whether the body is all in when it is read (taken at once) or not (read as it
    comes), the answer and the limit are the same."""
    go = asyncio.Event()

    async def handler(peer: Peer) -> None:
        await peer.request()
        if complete:
            peer.send(reply + b"0\r\n\r\n" if b"chunked" in reply else reply)
        else:
            head, _, body = reply.partition(b"\r\n\r\n")
            peer.send(head + b"\r\n\r\n")
            await go.wait()  # the test has seen the body is not in yet
            peer.send(body + (b"0\r\n\r\n" if b"chunked" in reply else b""))
        await peer.wait_eof()

    async def scenario() -> None:
        async with Server(handler) as server:
            spec = spec_at(server.port)
            upstream = Upstream((spec,), 1.0, 0.5)
            response = await upstream.open(spec, "/v1/x", b"{}", {})
            assert isinstance(response, Response)
            if complete:
                await poll(lambda: response.complete, "the whole body")
            else:
                assert not response.complete
            go.set()
            if isinstance(expected, bytes):
                assert await read_all(spec, response, limit) == expected
            else:
                with pytest.raises(AnswerTooLarge):
                    await read_all(spec, response, limit)
            assert response.closed
            await upstream.aclose()

    run(scenario())


def test_an_https_pool_verifies_tls_and_defaults_to_port_443() -> None:
    pool = Pool("https://api.example.com", connect_timeout=1.0, read_timeout=1.0)
    assert (pool.host, pool.port, pool.authority) == ("api.example.com", 443, "api.example.com")
    assert pool.ssl is not None
    assert pool.ssl.verify_mode is ssl.CERT_REQUIRED and pool.ssl.check_hostname
    plain = Pool("http://10.0.0.5", connect_timeout=1.0, read_timeout=1.0)
    assert (plain.port, plain.ssl) == (80, None)
    with pytest.raises(ValueError, match="http:// or https://"):
        Pool("ftp://10.0.0.5", connect_timeout=1.0, read_timeout=1.0)


def test_an_https_request_is_answered_over_verified_tls(
    run: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    names = "subjectAltName=DNS:localhost,IP:127.0.0.1"
    command = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
    command += ["-subj", "/CN=localhost", "-addext", names]
    subprocess.run(
        [*command, "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True
    )
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # the pool's only trusted authority
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    served.load_cert_chain(cert, key)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 6\r\n\r\nsecure")
        await writer.drain()
        writer.close()

    async def scenario() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=served)
        port = server.sockets[0].getsockname()[1]
        pool = Pool(f"https://127.0.0.1:{port}", connect_timeout=5.0, read_timeout=5.0)
        try:
            response = await pool.request("GET", "/v1/models")
            assert (response.status_code, await response.read()) == (200, b"secure")
        finally:
            pool.close()
            server.close()
            await server.wait_closed()

    run(scenario())


def test_upstream_sends_a_remote_its_path_prefix_and_key(run: Any) -> None:
    async def scenario() -> None:
        server = keep_alive_server()
        async with server:
            registry = f"""
models:
  far:
    id: far
    backend: remote
    url: http://127.0.0.1:{server.port}/openai/v1
    api_key_env: FAR_KEY
    default_timeout: 5
"""
            [spec] = parse_registry(registry, Path("models.yaml")).models
            upstream = Upstream((spec,), 1.0, 0.5, env={"FAR_KEY": "sk-far"})
            response = await upstream.open(spec, "/v1/chat/completions", b"{}", {"x-a": "1"})
            assert await read_all(spec, response, 1000) == b"hello"
            assert (await upstream.probe(spec)).status == "healthy"
            assert await upstream.fetch(spec, "/metrics", 1.0, 1000) == (200, b"hello")
            await upstream.aclose()
        heads = [request.partition(b"\r\n\r\n")[0] for request in server.requests]
        assert [head.split(b"\r\n")[0] for head in heads] == [
            b"POST /openai/v1/chat/completions HTTP/1.1",
            b"GET /openai/v1/models HTTP/1.1",
            b"GET /openai/metrics HTTP/1.1",
        ]
        assert all(b"authorization: Bearer sk-far" in head for head in heads)
        assert b"x-a: 1" in heads[0]

    run(scenario())
