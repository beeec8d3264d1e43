"""Races in the on-demand loader, made deterministic in-process: a model drained for a
waiter that left, an unload while a load is asked for but not yet published, and an
unload the supervisor refuses while a load is still launching. Each test failed on
the loader before its fix."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from slm_server.contracts.commands import Command, Reply
from slm_server.contracts.records import BackendState
from tests.unit.router.inprocess import (
    FakeStates,
    call,
    make_router,
    serving,
    until,
)
from tests.unit.router.ondemand.test_loader import (
    ON_DEMAND,
    aging_swap,
    answer_whole,
    chat_body,
    drain_chat_for_an_aged_coder,
    loader_of,
    run,
)


def test_a_model_drained_for_a_waiter_that_left_is_not_paused_for_ever(tmp_path: Path) -> None:
    """``chat`` is drained (its gate paused) for an aged ``coder`` waiter, which then
    gives up. Nothing would unload ``chat`` for it any more (no waiter, no idle TTL):
    its gate is resumed, not left paused with its requests queueing to their
    deadlines."""
    release = asyncio.Event()
    router = aging_swap(tmp_path, release)

    async def scenario() -> None:
        async with serving(router):
            await drain_chat_for_an_aged_coder(router, release)
            await until(lambda: not router.deps.gates["chat"].paused, "chat resumed")
            got = await call(
                router.app,
                "/v1/chat/completions",
                chat_body("org/chat-model"),
                headers={"x-request-timeout": "1"},
            )
            assert got.status == 200, got.body

    run(scenario())


class LaggingStates(FakeStates):
    """The router's view of the state file, frozen while ``frozen`` (the real view
    stats the file at most every 20 ms, and a load command is a socket round trip)."""

    def __init__(self, real: FakeStates) -> None:
        super().__init__()
        self.real = real
        self.frozen: dict[tuple[str, int], BackendState] | None = None

    def get(self, role: str, port: int) -> BackendState | None:
        source = self.frozen if self.frozen is not None else self.real.states
        return source.get((role, port))

    def current(self, role: str, port: int) -> BackendState | None:
        return self.get(role, port)  # the load command's answer not yet in the file

    def launcher_alive(self) -> bool:
        return self.real.alive


@pytest.mark.usefixtures("via")  # through plain ASGI and through the door
def test_an_unload_while_a_sent_load_is_not_yet_seen_leaves_the_model_unloaded(
    tmp_path: Path,
) -> None:
    """The planner has asked for a load the router does not see yet ("unloaded" for
    0.1 s more). ``/v1/models/unload`` waits for the load to show and stops it; it
    used to read "unloaded", answer 200 at once, and leave the model loading."""
    router = make_router(tmp_path, answer_whole, chat=ON_DEMAND)
    router.supervisor.unload_seconds = 0.02
    view = LaggingStates(router.states)
    real = router.supervisor.__call__

    def thaw() -> None:
        view.frozen = None

    async def lagging(command: Command) -> Reply:
        if command.op == "load" and view.frozen is None:
            view.frozen = dict(router.states.states)  # what the router still sees
            asyncio.get_running_loop().call_later(0.1, thaw)
        return await real(command)

    async def scenario() -> None:
        async with serving(router):
            loader = loader_of(router)
            loader.states, loader.commander = view, lagging
            waiting = asyncio.ensure_future(
                call(router.app, "/v1/models/load", {"model": "org/chat-model"})
            )
            await until(lambda: view.frozen is not None, "the load sent")
            assert loader.models["chat"].load_sent_at is not None
            unloaded = await asyncio.wait_for(
                call(router.app, "/v1/models/unload", {"model": "org/chat-model"}), 3.0
            )
            assert unloaded.status == 200, unloaded.body
            assert router.supervisor.state("chat") == "unloaded", (
                "the unload was answered, and the model is loading after it"
            )
            assert [c.reason for c in router.supervisor.commands if c.op == "unload"] == ["api"]
            await waiting

    run(scenario())


@pytest.mark.usefixtures("via")  # through plain ASGI and through the door
def test_an_unload_during_the_launch_of_a_load_is_not_refused(tmp_path: Path) -> None:
    """The supervisor refuses an unload while a load has no process yet (its launch is
    published "loading"). ``/v1/models/unload`` asks again until it is taken, and only
    then tells the waiting load "unloaded"; it used to tell the load so, answer 503
    ``unload_failed``, and let the model become ready."""
    router = make_router(tmp_path, answer_whole, chat=ON_DEMAND)
    router.supervisor.load_seconds = 3600.0  # the test publishes "ready"
    spec = router.spec_of("chat")
    real = router.supervisor.__call__
    launching = [False]
    refused: list[Command] = []

    async def supervisor(command: Command) -> Reply:
        if command.op == "unload" and launching[0]:
            router.supervisor.commands.append(command)
            refused.append(command)
            return Reply(False, "loading", "cannot unload while loading")
        reply = await real(command)
        if command.op == "load" and reply.ok:
            launching[0] = True
        return reply

    async def scenario() -> None:
        async with serving(router):
            loader = loader_of(router)
            loader.commander = supervisor
            waiting = asyncio.ensure_future(
                call(router.app, "/v1/models/load", {"model": "org/chat-model"})
            )
            await until(lambda: launching[0], "the load launching")
            unloading = asyncio.ensure_future(
                call(router.app, "/v1/models/unload", {"model": "org/chat-model"})
            )
            await until(lambda: bool(refused) or unloading.done(), "an unload asked")
            launching[0] = False  # spawned: the process can be stopped now
            router.supervisor.publish(spec, "loading")
            got: Any = await asyncio.wait_for(unloading, 3.0)
            assert got.status == 200, got.body
            assert router.supervisor.state("chat") == "unloaded"
            told = await waiting
            assert told.status == 503 and told.json()["error"]["code"] == "unloaded"

    run(scenario())
