"""Requests sent in-process through the door (:mod:`tests.unit.router.door_client`)
take the door's fast path, as every real request does: the body taken whole, a whole
answer written in one write, a stream spliced, a client's leaving heard from the door.
Without these checks a fast path that silently fell back to plain ASGI would pass every
test run ``via`` the door."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from slm_server.router.call.waits import ClientWatch
from slm_server.router.edge.http_protocol import DoorRequest
from tests.unit.router.door_client import through_door
from tests.unit.router.inprocess import (
    Answer,
    FakeResponse,
    Sent,
    call,
    make_router,
    run,
    sse,
    whole,
)
from tests.unit.router.test_proxy import ANSWER, CHAT, chat, delta


class Spied:
    """What the door's fast path was asked and answered, request by request."""

    def __init__(self) -> None:
        self.taken: list[bytes | None] = []
        self.answered: list[bool] = []
        self.written: list[bytes] = []
        self.watches: list[ClientWatch] = []


@pytest.fixture
def spied(monkeypatch: pytest.MonkeyPatch) -> Spied:
    """The real DoorRequest and ClientWatch, their results recorded."""
    seen = Spied()
    take_body, answer, write = DoorRequest.take_body, DoorRequest.answer, DoorRequest.write
    init = ClientWatch.__init__

    def spy_take(self: DoorRequest) -> bytes | None:
        body = take_body(self)
        seen.taken.append(body)
        return body

    async def spy_answer(self: DoorRequest, *args: Any) -> bool:
        sent = await answer(self, *args)
        seen.answered.append(sent)
        return sent

    def spy_write(self: DoorRequest, body: bytes) -> bool:
        seen.written.append(body)
        return write(self, body)

    def spy_init(self: ClientWatch, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        seen.watches.append(self)

    monkeypatch.setattr(DoorRequest, "take_body", spy_take)
    monkeypatch.setattr(DoorRequest, "answer", spy_answer)
    monkeypatch.setattr(DoorRequest, "write", spy_write)
    monkeypatch.setattr(ClientWatch, "__init__", spy_init)
    return seen


def answering(stream: Callable[[], FakeResponse]) -> Callable[[Sent], Any]:
    async def script(sent: Sent) -> FakeResponse:
        return stream() if sent.json().get("stream") else whole(ANSWER)

    return script


def test_a_whole_answer_takes_the_body_whole_and_goes_out_in_one_write(
    tmp_path: Path, spied: Spied
) -> None:
    router = make_router(tmp_path, answering(lambda: sse(delta("Hi", "stop"))))
    body = json.dumps(chat()).encode()

    async def scenario() -> None:
        async with router.app.router.lifespan_context(router.app):
            request = (
                b"POST %b HTTP/1.1\r\nhost: 127.0.0.1:8000\r\n"
                b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%b"
            ) % (CHAT.encode(), len(body), body)
            got = Answer()
            end = await through_door(router.app, request, got, asyncio.Event())
            assert got.status == 200 and got.json() == ANSWER
            [wire] = end.wire  # status line, headers and body: one write
            assert wire.startswith(b"HTTP/1.1 200 OK\r\n") and wire.endswith(got.body)

    run(scenario())
    assert spied.taken == [body]
    assert spied.answered == [True]


def test_a_stream_is_spliced_to_the_door(tmp_path: Path, spied: Spied) -> None:
    events = [delta("Hel"), delta("lo", "stop")]
    router = make_router(tmp_path, answering(lambda: sse(*events)))

    async def scenario() -> None:
        async with router.app.router.lifespan_context(router.app):
            got = await call(router.app, CHAT, chat(stream=True), via="door")
            assert got.events() == [*events, "[DONE]"]
            assert router.transport.responses[0].spliced

    run(scenario())
    assert (
        b"".join(spied.written)
        == b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
        + b"data: [DONE]\n\n"
    )


def test_a_client_leaving_is_heard_from_the_door_without_a_watcher_task(
    tmp_path: Path, spied: Spied
) -> None:
    never = asyncio.Event()
    router = make_router(tmp_path, answering(lambda: sse(delta("one"), then=[never])))

    async def scenario() -> None:
        async with router.app.router.lifespan_context(router.app):
            leave, answer = asyncio.Event(), Answer()
            task = asyncio.ensure_future(
                call(router.app, CHAT, chat(stream=True), leave=leave, answer=answer, via="door")
            )
            while not answer.chunks:
                await asyncio.sleep(0.001)
            leave.set()
            await asyncio.wait_for(task, 5)
            await asyncio.wait_for(router.transport.responses[0].closed.wait(), 2)
            [watch] = spied.watches
            assert watch.gone and watch._task is None  # told by the door, no task
            assert router.gate_active() == 0

    run(scenario())
