"""The door sends a whole answer's head and body in one write, and a stream's head at
once; driven in-process on a recording transport."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import uvicorn
from starlette.types import Receive, Scope, Send
from uvicorn.server import ServerState

from slm_server.router.door import HeldTransport, door_protocol, states_length
from slm_server.settings import DoorLimits


class Recording:
    """A transport that keeps every write."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 5000)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def set_write_buffer_limits(self, *args: Any, **kwargs: Any) -> None:
        pass


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


async def serve(app: Any) -> Recording:
    config = uvicorn.Config(app, log_config=None, lifespan="off")
    config.load()
    protocol = door_protocol(DoorLimits())(config=config, server_state=ServerState(), app_state={})
    transport = Recording()
    protocol.connection_made(transport)  # type: ignore[arg-type]
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


def test_held_transport() -> None:
    real = Recording()
    held = HeldTransport(real)  # type: ignore[arg-type]
    held.write(b"a")
    held.hold = True
    held.write(b"head")
    assert real.writes == [b"a"]
    held.write(b"body")
    assert real.writes == [b"a", b"headbody"]
    held.hold = True
    held.write(b"head2")
    held.close()
    assert real.writes[-1] == b"head2" and real.closed
    assert held.is_closing()


@pytest.mark.parametrize(
    ("headers", "expected"),
    [([(b"Content-Length", b"3")], True), ([(b"content-type", b"x")], False), ([], False)],
)
def test_states_length(headers: list[tuple[bytes, bytes]], expected: bool) -> None:
    assert states_length({"type": "http.response.start", "headers": headers}) is expected
