"""A request body all in by the time it is read is taken from the cycle whole
(:meth:`DoorRequest.take_body`), leaving the cycle as ASGI's ``receive`` would; anything else is
left to ``receive``. Driven in-process on a recording transport."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.types import Receive, Scope, Send

from slm_server.router.call.fast_path import FAST_PATH
from tests.unit.router.door_client import Reading, door_for

HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: %d\r\n%b\r\n"


async def answer(send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b""})


def test_a_body_all_in_is_taken_whole_once() -> None:
    seen: dict[str, Any] = {}
    transports: list[Reading] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        arrived = scope["extensions"][FAST_PATH]
        seen["body"] = arrived.take_body()
        seen["resumed"] = transports[0].resumed  # before the answer resumes it anyway
        seen["again"] = arrived.take_body()  # taken: the cycle holds nothing more
        await answer(send)

    async def run() -> Reading:
        transport = Reading()
        protocol = door_for(app, transport)
        transports.append(transport)
        body = b'{"a": "' + b"x" * 200_000 + b'"}'  # past uvicorn's high water: reading paused
        protocol.data_received(HEAD % (len(body), b"") + body)
        await asyncio.gather(*protocol.tasks)
        return transport

    transport = asyncio.run(run())
    assert seen["body"] == b'{"a": "' + b"x" * 200_000 + b'"}'
    assert seen["again"] is None
    assert seen["resumed"] == 1
    assert transport.resumed >= 1


def test_a_body_still_arriving_is_left_to_receive() -> None:
    seen: dict[str, Any] = {}
    started = asyncio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen["early"] = scope["extensions"][FAST_PATH].take_body()
        started.set()
        parts = []
        while True:
            message = await receive()
            parts.append(message["body"])
            if not message["more_body"]:
                break
        seen["received"] = b"".join(parts)
        await answer(send)

    async def run() -> None:
        protocol = door_for(app, Reading())
        protocol.data_received(HEAD % (4, b"") + b"ab")
        await started.wait()
        protocol.data_received(b"cd")
        await asyncio.gather(*protocol.tasks)

    asyncio.run(run())
    assert seen == {"early": None, "received": b"abcd"}


def test_a_client_waiting_for_100_continue_is_left_to_receive() -> None:
    seen: dict[str, Any] = {}

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen["taken"] = scope["extensions"][FAST_PATH].take_body()
        seen["received"] = (await receive())["body"]
        await answer(send)

    async def run() -> Reading:
        transport = Reading()
        protocol = door_for(app, transport)
        protocol.data_received(HEAD % (2, b"expect: 100-continue\r\n") + b"{}")
        await asyncio.gather(*protocol.tasks)
        return transport

    transport = asyncio.run(run())
    assert seen == {"taken": None, "received": b"{}"}
    assert transport.writes[0].startswith(b"HTTP/1.1 100 Continue")


def test_a_client_that_left_is_left_to_receive() -> None:
    seen: dict[str, Any] = {}
    left = asyncio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await left.wait()
        seen["taken"] = scope["extensions"][FAST_PATH].take_body()
        seen["received"] = (await receive())["type"]

    async def run() -> None:
        protocol = door_for(app, Reading())
        protocol.data_received(HEAD % (2, b"") + b"{}")
        protocol.connection_lost(None)
        left.set()
        await asyncio.gather(*protocol.tasks)

    asyncio.run(run())
    assert seen == {"taken": None, "received": "http.disconnect"}
