"""Loading on demand, in-process: the router with a scripted upstream and a fake
supervisor that carries out load and unload commands on the published states. The
first request loads, concurrent ones share the load, room is made from idle models
only, idle models go at their TTL, and the load/unload API."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import pytest

from slm_server.contracts.commands import Command, Reply
from slm_server.router.ondemand.loader import Loader
from tests.unit.router.inprocess import (
    Answer,
    FakeResponse,
    Router,
    Sent,
    call,
    entry_text,
    held_until,
    make_router,
    serving,
    sse,
    until,
    whole,
)

ON_DEMAND = "    load: on_demand\n"


def entry(role: str, port: int, *extra: str, on_demand: bool = True) -> str:
    """One more model (loaded on demand unless told otherwise)."""
    return entry_text(role, port, *extra, **({"load": "on_demand"} if on_demand else {}))


def chat_body(model: str, stream: bool = False) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": stream}


ANSWER = {
    "id": "x",
    "object": "chat.completion",
    "created": 1,
    "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
}


async def answer_whole(_sent: Sent) -> FakeResponse:
    return whole(ANSWER)


def run(scenario: Awaitable[None]) -> None:
    async def bounded() -> None:
        await asyncio.wait_for(scenario, 15)

    asyncio.run(bounded())


def with_footprints(router: Router, **footprints: int) -> Router:
    """Give these on-demand models their footprints, published unloaded."""
    router.supervisor.footprints.update(footprints)
    for role in footprints:
        router.supervisor.publish(router.spec_of(role), "unloaded")
    return router


async def start_chat_stream(router: Router) -> asyncio.Future[Answer]:
    """A chat stream that has begun (its backend holds it open): the model is busy."""
    streaming = Answer()
    stream = asyncio.ensure_future(
        call(
            router.app,
            "/v1/chat/completions",
            chat_body("org/chat-model", stream=True),
            answer=streaming,
        )
    )
    await until(lambda: bool(streaming.chunks), "the chat stream started")
    return stream


def loader_of(router: Router) -> Loader:
    """The router's on-demand planner (behind the load API's handler)."""
    [api] = [
        r.endpoint.__self__  # type: ignore[attr-defined]
        for r in router.app.routes
        if getattr(r, "path", "") == "/v1/models/load"
    ]
    loader: Loader = api.loader
    return loader


def aging_swap(tmp_path: Path, release: asyncio.Event) -> Router:
    """``chat`` and ``coder`` (600 MB each, 1000 MB of budget, aging 0.6 s): ``chat``'s
    first stream is held until ``release`` (later ``chat`` requests are answered
    whole), every ``coder`` request is answered whole."""

    async def script(sent: Sent) -> FakeResponse:
        if sent.spec.role == "chat" and not release.is_set():
            return sse({"choices": [{"delta": {"content": "a"}}]}, then=[release])
        return whole(ANSWER)

    router = make_router(
        tmp_path,
        script,
        chat=ON_DEMAND,
        more=entry("coder", 18002),
        env={"SLM_MEMORY_BUDGET_MB": "1000", "SLM_SWAP_AGING_SECONDS": "0.6"},
    )
    return with_footprints(router, chat=600, coder=600)


async def drain_chat_for_an_aged_coder(router: Router, release: asyncio.Event) -> None:
    """A ``chat`` stream held open, then ``coder`` requests that each give up (0.3 s)
    before the aging (0.6 s) until ``chat`` is drained for it; then the stream ends
    (``release``)."""
    stream = await start_chat_stream(router)
    short = {"x-request-timeout": "0.3"}
    for _ in range(3):
        got = await call(
            router.app, "/v1/chat/completions", chat_body("coder-model"), headers=short
        )
        assert got.status == 503
    assert router.deps.gates["chat"].paused  # drained for the aged coder
    release.set()
    assert (await stream).status == 200


def loads(router: Router) -> list[str]:
    return [c.role for c in router.supervisor.commands if c.op == "load"]


def unloads(router: Router) -> list[Command]:
    return [c for c in router.supervisor.commands if c.op == "unload"]


@pytest.mark.usefixtures("via")  # through plain ASGI and through the door
def test_the_first_request_loads_the_model_and_is_answered(tmp_path: Path) -> None:
    router = make_router(tmp_path, answer_whole, chat=ON_DEMAND)

    async def scenario() -> None:
        async with serving(router):
            assert router.supervisor.state("chat") == "unloaded"
            got = await call(router.app, "/v1/chat/completions", chat_body("org/chat-model"))
            assert got.status == 200
            assert loads(router) == ["chat"]
            assert router.supervisor.state("chat") == "ready"
            again = await call(router.app, "/v1/chat/completions", chat_body("org/chat-model"))
            assert again.status == 200
            assert loads(router) == ["chat"]  # loaded once

    run(scenario())


@pytest.mark.usefixtures("via")  # through plain ASGI and through the door
def test_concurrent_first_requests_share_one_load_and_are_served_in_order(
    tmp_path: Path,
) -> None:
    router = make_router(tmp_path, answer_whole, chat=ON_DEMAND, concurrency=2, queue=8)
    router.supervisor.load_seconds = 0.2

    async def scenario() -> None:
        async with serving(router):
            body = chat_body("org/chat-model")
            answers = await asyncio.gather(
                *(call(router.app, "/v1/chat/completions", body) for _ in range(8))
            )
            assert [a.status for a in answers] == [200] * 8
            assert loads(router) == ["chat"]
            assert router.supervisor.loads == 1

    run(scenario())


@pytest.mark.usefixtures("via")  # through plain ASGI and through the door
def test_the_least_recently_used_idle_model_makes_room_never_a_streaming_one(
    tmp_path: Path,
) -> None:
    release = asyncio.Event()

    async def script(sent: Sent) -> FakeResponse:
        if json.loads(sent.body).get("stream"):
            return sse({"choices": [{"delta": {"content": "a"}}]}, then=[release])
        return whole(ANSWER)

    more = entry("coder", 18002) + entry("embed", 18003)
    router = make_router(
        tmp_path,
        script,
        chat=ON_DEMAND,
        more=more,
        env={"SLM_MEMORY_BUDGET_MB": "1000", "SLM_SWAP_HOLD_SECONDS": "0.2"},
    )
    with_footprints(router, chat=400, coder=400, embed=400)

    async def scenario() -> None:
        async with serving(router):
            # chat streams (busy); coder answers and goes idle; embed needs room.
            stream = await start_chat_stream(router)
            coder = await call(router.app, "/v1/chat/completions", chat_body("coder-model"))
            assert coder.status == 200
            router.deps.gates["coder"].last_release -= 10  # idle past the hold
            third = await call(router.app, "/v1/chat/completions", chat_body("embed-model"))
            assert third.status == 200
            [evicted] = unloads(router)
            assert (evicted.role, evicted.reason, evicted.for_model) == (
                "coder",
                "evicted",
                "embed-model",
            )
            assert router.supervisor.state("chat") == "ready"
            release.set()
            done = await stream
            assert done.status == 200 and done.events()[-1] == "[DONE]"

    run(scenario())


@pytest.mark.usefixtures("via")  # through plain ASGI and through the door
def test_a_model_that_cannot_fit_waits_then_gets_503_insufficient_memory(
    tmp_path: Path,
) -> None:
    release = asyncio.Event()
    slow = held_until(release, ANSWER, roles=["chat"])
    router = make_router(
        tmp_path,
        slow,
        chat=ON_DEMAND,
        more=entry("coder", 18002),
        env={"SLM_MEMORY_BUDGET_MB": "1000"},
    )
    with_footprints(router, chat=600, coder=600)

    async def scenario() -> None:
        async with serving(router):
            busy = asyncio.ensure_future(
                call(router.app, "/v1/chat/completions", chat_body("org/chat-model"))
            )
            await until(lambda: router.supervisor.state("chat") == "ready", "chat loaded")
            got = await call(
                router.app,
                "/v1/chat/completions",
                chat_body("coder-model"),
                headers={"x-request-timeout": "0.3"},
            )
            assert got.status == 503
            error = got.json()["error"]
            assert error["code"] == "insufficient_memory"
            assert "in use: org/chat-model" in error["message"]
            assert "retry-after" in got.headers
            assert unloads(router) == []  # the busy model was left alone
            release.set()
            assert (await busy).status == 200

    run(scenario())


@pytest.mark.usefixtures("via")  # through plain ASGI and through the door
def test_a_model_larger_than_the_budget_is_refused_at_once(tmp_path: Path) -> None:
    router = make_router(
        tmp_path, answer_whole, chat=ON_DEMAND, env={"SLM_MEMORY_BUDGET_MB": "100"}
    )
    router.supervisor.footprints["chat"] = 500
    router.supervisor.publish(router.spec, "unloaded")

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, "/v1/chat/completions", chat_body("org/chat-model"))
            assert got.status == 503
            assert got.json()["error"]["code"] == "insufficient_memory"
            assert "more than the whole memory budget" in got.json()["error"]["message"]
            assert loads(router) == []

    run(scenario())


@pytest.mark.usefixtures("via")  # through plain ASGI and through the door
def test_a_failed_load_is_503_with_the_reason(tmp_path: Path) -> None:
    router = make_router(tmp_path, answer_whole, chat=ON_DEMAND)
    router.supervisor.fail_load = "exited with status 1 while loading"

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, "/v1/chat/completions", chat_body("org/chat-model"))
            assert got.status == 503
            error = got.json()["error"]
            assert error["code"] == "load_failed"
            assert "exited with status 1 while loading" in error["message"]
            assert router.transport.sent == []

    run(scenario())


@pytest.mark.usefixtures("via")  # through plain ASGI and through the door
def test_a_load_waiting_on_a_restarting_model_ends_when_the_watchdog_abandons_it(
    tmp_path: Path,
) -> None:
    """A model that crashed is restarting when the load API asks for it: the request
    waits for the restart, and when the watchdog gives up on it (a final state, which a
    load does not leave) the request is answered at once, not at its deadline."""
    router = make_router(tmp_path, answer_whole, chat=ON_DEMAND)
    chat = router.spec_of("chat")

    async def scenario() -> None:
        async with serving(router):
            router.supervisor.publish(chat, "restarting", reason="exited with status 139")
            loop = asyncio.get_running_loop()
            asked = loop.time()
            loading = asyncio.ensure_future(
                call(router.app, "/v1/models/load", {"model": "org/chat-model"})
            )
            await until(lambda: loader_of(router).models["chat"].waiting is not None, "waiting")
            assert not loading.done()
            router.supervisor.publish(chat, "abandoned", reason="restart budget exhausted")
            got = await loading
            assert got.status == 503
            error = got.json()["error"]
            assert error["code"] == "backend_abandoned"
            assert "restart budget exhausted" in error["message"]
            assert loop.time() - asked < 2.5  # the deadline is default_timeout, 5 s
            assert loads(router) == []

    run(scenario())


@pytest.mark.usefixtures("via")  # through plain ASGI and through the door
def test_an_idle_model_is_unloaded_at_its_ttl(tmp_path: Path) -> None:
    router = make_router(tmp_path, answer_whole, chat=ON_DEMAND + "    idle_ttl: 0.2\n")

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, "/v1/chat/completions", chat_body("org/chat-model"))
            assert got.status == 200
            await until(lambda: router.supervisor.state("chat") == "unloaded", "unloaded")
            [unload] = unloads(router)
            assert unload.reason == "idle_ttl"

    run(scenario())


@pytest.mark.usefixtures("via")  # through plain ASGI and through the door
def test_a_waiting_client_that_leaves_gives_up_its_place(tmp_path: Path) -> None:
    router = make_router(tmp_path, answer_whole, chat=ON_DEMAND)
    router.supervisor.load_seconds = 0.3

    async def scenario() -> None:
        async with serving(router):
            leave = asyncio.Event()
            waiting = asyncio.ensure_future(
                call(router.app, "/v1/chat/completions", chat_body("org/chat-model"), leave=leave)
            )
            await until(lambda: loads(router) == ["chat"], "load asked")
            leave.set()
            await waiting
            gate = router.deps.gates["chat"]
            await until(lambda: gate.active == 0, "slot given back")
            loader_model = router.supervisor  # the load itself goes on and ends ready
            await until(lambda: loader_model.state("chat") == "ready", "ready")
            assert router.transport.sent == []

    run(scenario())


@pytest.mark.usefixtures("via")  # through plain ASGI and through the door
def test_load_and_unload_api(tmp_path: Path) -> None:
    release = asyncio.Event()
    slow = held_until(release, ANSWER)
    router = make_router(
        tmp_path, slow, chat=ON_DEMAND, more=entry("always", 18002, on_demand=False)
    )
    always = router.spec_of("always")

    async def scenario() -> None:
        async with serving(router):
            router.supervisor.publish(always, "ready")
            loaded = await call(router.app, "/v1/models/load", {"model": "org/chat-model"})
            assert loaded.status == 200
            assert loaded.json()["status"]["state"] == "ready"
            assert loaded.json()["status"]["load"] == "on_demand"
            in_flight = asyncio.ensure_future(
                call(router.app, "/v1/chat/completions", chat_body("org/chat-model"))
            )
            await until(lambda: router.gate_active() == 1, "in flight")
            unloading = asyncio.ensure_future(
                call(router.app, "/v1/models/unload", {"model": "org/chat-model"})
            )
            await asyncio.sleep(0.1)
            assert not unloading.done()  # it waits for the request in flight
            assert unloads(router) == []
            release.set()
            assert (await in_flight).status == 200
            unloaded = await unloading
            assert unloaded.status == 200
            assert unloaded.json()["status"]["state"] == "unloaded"
            missing = await call(router.app, "/v1/models/load", {"model": "nope"})
            assert missing.status == 404
            refused = await call(router.app, "/v1/models/unload", {"model": "always-model"})
            assert refused.status == 409

    run(scenario())


@pytest.mark.usefixtures("via")  # through plain ASGI and through the door
def test_an_unload_never_lets_a_request_reach_a_stopping_process(tmp_path: Path) -> None:
    router = make_router(tmp_path, answer_whole, chat=ON_DEMAND)
    router.supervisor.unload_seconds = 0.2

    async def scenario() -> None:
        async with serving(router):
            await call(router.app, "/v1/models/load", {"model": "org/chat-model"})
            unloading = asyncio.ensure_future(
                call(router.app, "/v1/models/unload", {"model": "org/chat-model"})
            )
            await until(lambda: router.supervisor.state("chat") == "unloading", "unloading")
            # A request during the unload waits for it, then loads the model again.
            got = await call(router.app, "/v1/chat/completions", chat_body("org/chat-model"))
            assert got.status == 200
            assert (await unloading).status == 200
            assert loads(router) == ["chat", "chat"]
            assert len(router.transport.sent) == 1

    run(scenario())


@pytest.mark.usefixtures("via")  # through plain ASGI and through the door
def test_a_load_nobody_waits_for_any_more_is_stopped_unless_near_done(tmp_path: Path) -> None:
    router = make_router(tmp_path, answer_whole, chat=ON_DEMAND)
    router.supervisor.load_seconds = 0.4

    async def scenario() -> None:
        async with serving(router):
            # A first load: nothing to judge "near done" by, so it would go on; it sets
            # how long a load of this model takes.
            await call(router.app, "/v1/models/load", {"model": "org/chat-model"})
            await call(router.app, "/v1/models/unload", {"model": "org/chat-model"})
            leave = asyncio.Event()
            waiting = asyncio.ensure_future(
                call(router.app, "/v1/chat/completions", chat_body("org/chat-model"), leave=leave)
            )
            await until(lambda: loads(router) == ["chat", "chat"], "second load asked")
            leave.set()  # well before half of the 0.4 s a load takes
            await waiting
            await until(lambda: router.supervisor.state("chat") == "unloaded", "load stopped")
            assert [c.reason for c in unloads(router)] == ["api", "no_waiter"]
            assert router.transport.sent == []

    run(scenario())


def test_a_model_whose_requests_give_up_before_aging_still_ages(tmp_path: Path) -> None:
    """Each request for ``coder`` gives up (0.3 s) long before the aging (0.6 s), but
    its age carries over from one to the next: the busy ``chat`` is drained."""
    release = asyncio.Event()
    router = aging_swap(tmp_path, release)

    async def scenario() -> None:
        async with serving(router):
            await drain_chat_for_an_aged_coder(router, release)
            got = await call(router.app, "/v1/chat/completions", chat_body("coder-model"))
            assert got.status == 200
            assert [(c.role, c.reason) for c in unloads(router)] == [("chat", "evicted")]

    run(scenario())


@pytest.mark.usefixtures("via")  # through plain ASGI and through the door
def test_a_load_the_state_file_never_showed_is_asked_for_again(tmp_path: Path) -> None:
    """A load the state file never shows (it came and went between two looks, or was
    lost): the request still waiting is not left to its deadline."""
    router = make_router(tmp_path, answer_whole, chat=ON_DEMAND)
    real = router.supervisor.__call__
    lost = [True]

    async def forgetful(command: Command) -> Reply:
        if command.op == "load" and lost[0]:
            lost[0] = False
            router.supervisor.commands.append(command)
            return Reply(True, "loading")  # taken, and never published
        return await real(command)

    async def scenario() -> None:
        async with serving(router):
            loader_of(router).commander = forgetful
            got = await call(router.app, "/v1/chat/completions", chat_body("org/chat-model"))
            assert got.status == 200
            assert loads(router) == ["chat", "chat"]

    run(scenario())


@pytest.mark.usefixtures("via")  # through plain ASGI and through the door
def test_an_unload_is_answered_when_a_waiting_request_loads_the_model_again_at_once(
    tmp_path: Path,
) -> None:
    """The state file says "unloaded" only between two of the unload's own looks: the
    planner saw it and loaded the model again for a load that waited. The unload is
    answered then, not left to its 60 s bound (seen in CI: a load/unload storm)."""
    router = make_router(tmp_path, answer_whole, chat=ON_DEMAND)
    router.supervisor.unload_seconds = 3600.0  # the test publishes the unload's end
    spec = router.spec_of("chat")

    async def scenario() -> None:
        async with serving(router):
            loader = loader_of(router)
            loaded = await call(router.app, "/v1/models/load", {"model": "org/chat-model"})
            assert loaded.status == 200
            unloading = asyncio.ensure_future(
                call(router.app, "/v1/models/unload", {"model": "org/chat-model"})
            )
            await until(lambda: router.supervisor.state("chat") == "unloading", "unloading")
            # A load by request waits without an admission slot (a chat request would
            # queue at the paused gate first).
            waiting = asyncio.ensure_future(
                call(router.app, "/v1/models/load", {"model": "org/chat-model"})
            )
            await until(lambda: loader.models["chat"].waiting is not None, "a load waits")
            router.supervisor.publish(spec, "unloaded")
            await loader.plan()  # no await yields in it here: the unload has not looked
            assert router.supervisor.state("chat") == "loading"
            unloaded = await asyncio.wait_for(unloading, 2.0)
            assert unloaded.status == 200, unloaded.body
            assert (await waiting).status == 200
            assert loads(router) == ["chat", "chat"]

    run(scenario())
