"""Bounded waits: the deadline, the client's disconnect and the drain each end a wait
with the error that says why; one watcher serves every wait of a request."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from slm_server.errors import BackendUnavailable, ClientDisconnected
from slm_server.router.call.waits import ClientWatch, Waits, client_of


class Client:
    """An ASGI ``receive`` that reports a disconnect once told to."""

    def __init__(self) -> None:
        self.left = asyncio.Event()
        self.calls = 0

    async def receive(self) -> dict[str, Any]:
        self.calls += 1
        await self.left.wait()
        return {"type": "http.disconnect"}


def later(seconds: float) -> float:
    """The loop time ``seconds`` from now (what a wait is bounded by)."""
    return asyncio.get_running_loop().time() + seconds


async def forever() -> None:
    await asyncio.Event().wait()


async def answer() -> str:
    await asyncio.sleep(0)
    return "answer"


def test_work_that_finishes_returns_its_result() -> None:
    async def scenario() -> None:
        client = Client()
        watch = ClientWatch(client.receive)
        assert await Waits().run(watch, answer(), later(5.0)) == "answer"
        assert await Waits().run(watch, answer(), later(5.0)) == "answer"
        await asyncio.sleep(0)
        assert client.calls == 1, "one watcher for every wait of the request"
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0

    asyncio.run(scenario())


def test_the_deadline_is_a_timeout_error() -> None:
    async def scenario() -> None:
        with pytest.raises(TimeoutError):
            await Waits().run(ClientWatch(Client().receive), forever(), later(0.05))
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0

    asyncio.run(scenario())


def test_a_client_that_leaves_ends_this_wait_and_every_later_one() -> None:
    async def scenario() -> None:
        client = Client()
        scope: dict[str, Any] = {}
        watch = client_of(scope, client.receive)
        assert client_of(scope, client.receive) is watch
        waiting = asyncio.ensure_future(Waits().run(watch, forever(), later(5.0)))
        await asyncio.sleep(0)
        client.left.set()
        with pytest.raises(ClientDisconnected):
            await waiting
        started = []

        async def never_started() -> None:
            started.append(True)

        with pytest.raises(ClientDisconnected):
            await Waits().run(watch, never_started(), later(5.0))
        assert not started

    asyncio.run(scenario())


def test_the_end_of_the_drain_ends_every_wait() -> None:
    async def scenario() -> None:
        waits = Waits()
        waiting = [
            asyncio.ensure_future(waits.run(ClientWatch(Client().receive), forever(), later(5.0)))
            for _ in range(2)
        ]
        await asyncio.sleep(0)
        waits.cancel_all()
        for each in waiting:
            with pytest.raises(BackendUnavailable) as caught:
                await each
            assert caught.value.code == "shutting_down"

    asyncio.run(scenario())


def test_a_cancel_from_outside_stays_a_cancel() -> None:
    async def scenario() -> None:
        waiting = asyncio.ensure_future(
            Waits().run(ClientWatch(Client().receive), forever(), later(5.0))
        )
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting

    asyncio.run(scenario())
