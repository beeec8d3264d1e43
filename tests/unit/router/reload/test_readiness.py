"""Requests for a backend a reload started (published ``starting`` with ``reloaded``)
wait for it, holding their admission slot, instead of a 503: they go on once it is
ready, get 503 ``model_loading`` at their deadline, the usual refusal when it fails
meanwhile, and leave the line when their client does. A backend starting that no
reload started is refused at once, as before."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from slm_server.contracts.applied_registry import RegistryStamp, version_of, write_snapshot
from tests.unit.router.inprocess import (
    FakeResponse,
    Router,
    Sent,
    call,
    make_router,
    registry_text,
    run,
    serving,
    until,
    whole,
)
from tests.unit.router.reload.reloading import ANSWER, CHAT, CHAT_ID, chat_body


async def answer_whole(_sent: Sent) -> FakeResponse:
    return whole(ANSWER)


def started_by_a_reload(tmp_path: Path, **fields: Any) -> Router:
    """A supervised router whose chat backend a reload just started."""
    router = make_router(tmp_path, answer_whole, **fields)
    router.states.alive = True
    for spec in router.registry.enabled:
        router.supervisor.publish(spec, "starting", reloaded=True, reason="reload: starting")
    return router


def test_a_request_waits_holding_its_slot_until_the_backend_is_ready(tmp_path: Path) -> None:
    router = started_by_a_reload(tmp_path)

    async def scenario() -> None:
        async with serving(router):
            waiting = asyncio.ensure_future(call(router.app, CHAT, chat_body(CHAT_ID)))
            await until(lambda: router.gate_active() == 1, "the request admitted")
            await asyncio.sleep(0.1)  # several looks at the state: still starting
            assert not waiting.done() and router.transport.sent == []
            router.supervisor.publish(router.spec, "ready")
            got = await waiting
            assert got.status == 200, got.body
            assert len(router.transport.sent) == 1
            assert router.gate_active() == 0

    run(scenario())


def test_at_its_deadline_a_waiting_request_gets_model_loading(tmp_path: Path) -> None:
    router = started_by_a_reload(tmp_path)

    async def scenario() -> None:
        async with serving(router):
            got = await call(
                router.app, CHAT, chat_body(CHAT_ID), headers={"x-request-timeout": "0.3"}
            )
            assert got.status == 503
            assert got.json()["error"]["code"] == "model_loading"
            assert "started by a registry reload" in got.json()["error"]["message"]
            assert got.headers["retry-after"] == "5"
            assert router.transport.sent == [] and router.gate_active() == 0

    run(scenario())


def test_a_backend_that_fails_while_awaited_gets_the_usual_refusal(tmp_path: Path) -> None:
    router = started_by_a_reload(tmp_path)

    async def scenario() -> None:
        async with serving(router):
            waiting = asyncio.ensure_future(call(router.app, CHAT, chat_body(CHAT_ID)))
            await until(lambda: router.gate_active() == 1, "the request admitted")
            router.supervisor.publish(
                router.spec, "failed", reloaded=True, reason="exit code 1 while starting"
            )
            got = await waiting
            assert got.status == 503
            assert got.json()["error"]["code"] == "backend_failed"
            assert "exit code 1 while starting" in got.json()["error"]["message"]
            assert router.transport.sent == [] and router.gate_active() == 0

    run(scenario())


def test_a_client_that_leaves_gives_up_its_slot(tmp_path: Path) -> None:
    router = started_by_a_reload(tmp_path)

    async def scenario() -> None:
        async with serving(router):
            leave = asyncio.Event()
            waiting = asyncio.ensure_future(call(router.app, CHAT, chat_body(CHAT_ID), leave=leave))
            await until(lambda: router.gate_active() == 1, "the request admitted")
            leave.set()
            await waiting
            await until(lambda: router.gate_active() == 0, "the slot given back")
            assert router.transport.sent == []

    run(scenario())


def test_a_backend_starting_that_no_reload_started_is_refused_at_once(tmp_path: Path) -> None:
    router = make_router(tmp_path, answer_whole)
    router.states.alive = True
    router.supervisor.publish(router.spec, "starting")

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, CHAT, chat_body(CHAT_ID))
            assert got.status == 503
            assert got.json()["error"]["code"] == "backend_starting"
            assert got.headers["retry-after"] == "5"

    run(scenario())


def test_a_replica_that_serves_is_chosen_over_one_a_reload_started(tmp_path: Path) -> None:
    router = make_router(tmp_path, answer_whole, chat="    replicas: 2\n")
    router.states.alive = True
    first, second = router.registry.enabled
    router.supervisor.publish(first, "starting", reloaded=True)
    router.supervisor.publish(second, "ready")

    async def scenario() -> None:
        async with serving(router):
            for _ in range(3):
                got = await call(router.app, CHAT, chat_body(CHAT_ID))
                assert got.status == 200, got.body
            assert {sent.spec.role for sent in router.transport.sent} == {second.role}

    run(scenario())


def test_until_the_router_follows_the_reload_its_old_backend_serves(tmp_path: Path) -> None:
    """The state file already says the reload started the new backend; the router still
    routes by the registry before it (its snapshot not read yet): the old process, alive
    until retired, answers, and no request holds a slot of the old gate waiting."""
    router = started_by_a_reload(tmp_path, follow_seconds=3600)
    newer = registry_text(concurrency=3)
    router.states.registry = RegistryStamp(version_of(newer), 2, 0.0, "/srv/models.yaml")

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, CHAT, chat_body(CHAT_ID))
            assert got.status == 200, got.body
            write_snapshot(router.settings.log_dir, newer)
            await router.follower.sync()
            waiting = asyncio.ensure_future(call(router.app, CHAT, chat_body(CHAT_ID)))
            await until(lambda: router.gate_active() == 1, "the request admitted")
            assert len(router.transport.sent) == 1 and not waiting.done()
            router.supervisor.publish(router.spec, "ready")
            assert (await waiting).status == 200

    run(scenario())
