"""The door tells a request's :class:`DoorRequest` the moment its connection is lost, and
the request's :class:`ClientWatch` hears it there with no watcher task; driven
in-process on a recording transport."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.types import Receive, Scope, Send

from slm_server.router.call.exchange import exchange_of
from slm_server.router.call.fast_path import FAST_PATH
from slm_server.router.call.waits import client_of
from slm_server.router.edge.http_protocol import DoorRequest
from tests.unit.router.door_client import Recording, door_for

GET = b"GET / HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n"


async def until(condition: Any) -> None:
    async with asyncio.timeout(5):
        while not condition():
            await asyncio.sleep(0)


def test_a_client_leaving_mid_answer_is_heard_without_a_task() -> None:
    heard: list[str] = []
    armed = asyncio.Event()
    seen: dict[str, Any] = {}

    async def waits(scope: Scope, receive: Receive, send: Send) -> None:
        watch = client_of(scope, receive)
        seen["tasks"] = len(asyncio.all_tasks())
        assert watch.arm(lambda: heard.append("gone"))
        seen["tasks after arm"] = len(asyncio.all_tasks())
        armed.set()
        await until(lambda: watch.gone)
        seen["exchange"] = exchange_of(scope).disconnected
        assert not watch.arm(lambda: heard.append("again"))

    async def run() -> None:
        protocol = door_for(waits, Recording())
        protocol.data_received(GET)
        await armed.wait()
        assert heard == []
        protocol.connection_lost(None)
        assert heard == ["gone"]  # told at once, inside connection_lost
        await asyncio.gather(*protocol.tasks)

    asyncio.run(run())
    assert seen == {"tasks": seen["tasks"], "tasks after arm": seen["tasks"], "exchange": True}
    assert heard == ["gone"]


def test_a_request_whose_answer_ended_is_not_told() -> None:
    presences: list[DoorRequest] = []
    heard: list[str] = []

    async def answers(scope: Scope, receive: Receive, send: Send) -> None:
        presence = scope["extensions"][FAST_PATH]
        presence.on_gone = lambda: heard.append("gone")
        presences.append(presence)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def run() -> None:
        protocol = door_for(answers, Recording())
        protocol.data_received(GET)
        await asyncio.gather(*protocol.tasks)
        protocol.connection_lost(None)

    asyncio.run(run())
    assert heard == []
    assert not presences[0].gone


def test_a_stream_running_ahead_of_a_pipelined_request_is_told() -> None:
    heard: list[str] = []
    started: list[str] = []

    async def streams(scope: Scope, receive: Receive, send: Send) -> None:
        name = scope["path"]
        watch = client_of(scope, receive)
        started.append(name)
        if name == "/first":
            headers = [(b"content-type", b"text/event-stream")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            assert watch.arm(lambda: heard.append(name))
            await until(lambda: watch.gone)

    async def run() -> None:
        protocol = door_for(streams, Recording())
        protocol.data_received(b"GET /first HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
        await until(lambda: started == ["/first"])
        protocol.data_received(b"GET /second HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
        protocol.connection_lost(None)
        assert heard == ["/first"]
        await asyncio.gather(*protocol.tasks)

    asyncio.run(run())
    assert heard == ["/first"]


def test_a_client_gone_before_its_first_wait_is_gone_at_once() -> None:
    seen: dict[str, Any] = {}
    lost = asyncio.Event()

    async def late(scope: Scope, receive: Receive, send: Send) -> None:
        await lost.wait()
        watch = client_of(scope, receive)
        seen["armed"] = watch.arm(lambda: seen.setdefault("called", True))
        seen["gone"] = watch.gone
        seen["exchange"] = exchange_of(scope).disconnected

    async def run() -> None:
        protocol = door_for(late, Recording())
        protocol.data_received(GET)
        protocol.connection_lost(None)
        lost.set()
        await asyncio.gather(*protocol.tasks)

    asyncio.run(run())
    assert seen == {"armed": False, "gone": True, "exchange": True}
