"""The door sends a whole answer's head and body in one write, and a stream's head at
once; driven in-process on a recording transport."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.types import Receive, Scope, Send

from slm_server.router.call.fast_path import FAST_PATH
from slm_server.router.edge.http_protocol import DoorRequest, HeldTransport
from tests.unit.router.door_client import Recording, door_for


async def whole(scope: Scope, receive: Receive, send: Send) -> None:
    body = b'{"ok": true}'
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def streamed(scope: Scope, receive: Receive, send: Send) -> None:
    headers = [(b"content-type", b"text/event-stream")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def fails_after_start(scope: Scope, receive: Receive, send: Send) -> None:
    headers = [(b"content-length", b"5")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    raise RuntimeError("broken")


async def serve(app: Any, transport: Recording | None = None) -> Recording:
    transport = transport or Recording()
    protocol = door_for(app, transport)
    protocol.data_received(b"GET / HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
    await asyncio.gather(*protocol.tasks)
    protocol.connection_lost(None)
    return transport


def test_a_whole_answer_is_one_write() -> None:
    transport = asyncio.run(serve(whole))
    [write] = transport.writes
    assert write.startswith(b"HTTP/1.1 200 OK\r\n")
    assert write.endswith(b'\r\n\r\n{"ok": true}')


def test_a_stream_sends_its_head_at_once() -> None:
    transport = asyncio.run(serve(streamed))
    head, *rest = transport.writes
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and head.endswith(b"\r\n\r\n")
    assert b"".join(rest) == b"9\r\ndata: 1\n\n\r\n0\r\n\r\n"


def test_a_held_head_is_sent_before_the_connection_closes() -> None:
    transport = asyncio.run(serve(fails_after_start))
    assert transport.writes[0].startswith(b"HTTP/1.1 200 OK\r\n")
    assert transport.closed


def test_a_head_is_kept_no_longer_than_one_turn_of_the_loop() -> None:
    transport = Recording()
    seen: list[list[bytes]] = []

    async def pauses_after_start(scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-length", b"2")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        seen.append(list(transport.writes))
        await asyncio.sleep(0)  # one turn of the loop: the head is not kept longer
        seen.append(list(transport.writes))
        await send({"type": "http.response.body", "body": b"ok"})

    asyncio.run(serve(pauses_after_start, transport))
    assert seen[0] == []
    [head] = seen[1]
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert transport.writes == [head, b"ok"]


def test_held_transport_keeps_only_a_head_with_a_length() -> None:
    async def run() -> list[bytes]:
        real = Recording()
        held = HeldTransport(real, asyncio.get_running_loop())  # type: ignore[arg-type]
        held.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        held.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n")
        held.write(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\n")
        assert len(real.writes) == 2
        held.write(b"body")
        held.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
        held.close()
        assert real.closed and held.is_closing()
        return real.writes

    assert asyncio.run(run()) == [
        b"HTTP/1.1 100 Continue\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nbody",
        b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
    ]


def test_a_streams_pieces_written_directly_are_framed_as_uvicorn_frames_them() -> None:
    refused: list[bool] = []
    full: list[bool] = []
    usable: list[bool] = []

    async def spliced(scope: Scope, receive: Receive, send: Send) -> None:
        writer = scope["extensions"][FAST_PATH]
        assert isinstance(writer, DoorRequest)
        refused.append(writer.write(b"before the head"))
        usable.append(writer.writable)
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        usable.append(writer.writable)
        assert writer.write(b"data: 1\n\n")
        full.append(writer.full)
        await writer.drain()  # room in the buffer: returns at once
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        refused.append(writer.write(b"after the end"))
        usable.append(writer.writable)

    transport = asyncio.run(serve(spliced))
    head, *rest = transport.writes
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"transfer-encoding: chunked" in head
    assert b"".join(rest) == b"9\r\ndata: 1\n\n\r\n0\r\n\r\n"
    assert refused == [False, False]
    assert full == [False]
    assert usable == [False, True, False]
