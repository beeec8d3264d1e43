"""Memory pressure, in-process: the router with a scripted memory source and a fake
supervisor. Below the floor the idle on-demand models are unloaded least recently
used first (reason ``pressure``), never a busy or an ``always`` one; loads are refused
with 503 ``insufficient_memory`` until the free memory is back above the resume
level, and readings between the floor and that level change nothing; ``/health``
shows the machine's free memory beside the budget."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tests.unit.router.inprocess import (
    FakeResponse,
    Router,
    Sent,
    call,
    make_router,
    serving,
    sse,
    until,
    whole,
)
from tests.unit.router.ondemand.test_loader import (
    ANSWER,
    ON_DEMAND,
    chat_body,
    entry,
    loader_of,
    run,
    start_chat_stream,
    unloads,
    with_footprints,
)

PRESSURE_ENV = {
    "SLM_MEMORY_BUDGET_MB": "100000",
    "SLM_MEMORY_FLOOR_MB": "1000",  # pressure ends at 1256 MiB free
    "SLM_MEMORY_POLL_SECONDS": "0.05",
}


def pressure_router(tmp_path: Path, release: asyncio.Event) -> Router:
    """``chat`` (its first stream held until ``release``), ``coder`` and ``embed`` on
    demand, 400 MiB each; ``base`` always loaded (300 MiB)."""

    async def script(sent: Sent) -> FakeResponse:
        if sent.json().get("stream") and not release.is_set():
            return sse({"choices": [{"delta": {"content": "a"}}]}, then=[release])
        return whole(ANSWER)

    more = entry("coder", 18002) + entry("embed", 18003) + entry("base", 18004, on_demand=False)
    router = make_router(tmp_path, script, chat=ON_DEMAND, more=more, env=PRESSURE_ENV)
    router.supervisor.footprints["base"] = 300
    router.supervisor.publish(router.spec_of("base"), "ready")
    return with_footprints(router, chat=400, coder=400, embed=400)


def pressure_events(router: Router) -> list[dict[str, Any]]:
    return router.events.named("memory_pressure")


async def readings_after(router: Router, count: int) -> None:
    """Wait until the router has judged ``count`` readings taken after this call (one
    more than that: a reading under way may have read the source before it)."""
    watch = loader_of(router).pressure
    assert watch is not None
    seen = watch.readings
    await until(lambda: watch.readings >= seen + count + 1, f"{count} more readings")


def test_below_the_floor_idle_models_go_least_recently_used_first_and_loads_wait(
    tmp_path: Path,
) -> None:
    release = asyncio.Event()
    router = pressure_router(tmp_path, release)

    async def scenario() -> None:
        async with serving(router):
            stream = await start_chat_stream(router)  # chat is busy
            for model in ("coder-model", "embed-model"):  # coder is the least recently used
                assert (
                    await call(router.app, "/v1/chat/completions", chat_body(model))
                ).status == 200
            assert unloads(router) == []

            router.memory.free_mb = 990
            await until(lambda: len(unloads(router)) == 2, "both idle models unloaded")
            assert [(c.role, c.reason) for c in unloads(router)] == [
                ("coder", "pressure"),
                ("embed", "pressure"),
            ]
            [entered] = pressure_events(router)
            assert entered["state"] == "entered" and entered["free_mb"] == 990
            assert (entered["floor_mb"], entered["resume_mb"]) == (1000, 1256)
            named = {h["role"]: h for h in entered["holders"]}
            assert named["base"]["load"] == "always" and named["base"]["memory_mb"] == 300
            assert named["chat"]["busy"] is True and named["coder"]["busy"] is False
            evicted = router.events.named("evicted_for_pressure")
            assert [(e["role"], e["model_id"]) for e in evicted] == [
                ("coder", "coder-model"),
                ("embed", "embed-model"),
            ]
            assert evicted[0]["free_mb"] == 990 and evicted[0]["floor_mb"] == 1000
            assert evicted[0]["memory_mb"] == 400 and evicted[0]["port"] == 18002

            # The busy model and the always one stay, however long it lasts.
            await readings_after(router, 3)
            assert [c.role for c in unloads(router)] == ["coder", "embed"]
            assert router.supervisor.state("chat") == "ready"
            assert router.supervisor.state("base") == "ready"

            # A load is refused at once, with the reason.
            refused = await call(router.app, "/v1/chat/completions", chat_body("coder-model"))
            assert refused.status == 503, refused.body
            error = refused.json()["error"]
            assert error["code"] == "insufficient_memory"
            assert "990 MiB" in error["message"] and "memory floor of 1000 MiB" in error["message"]
            assert refused.headers.get("retry-after")
            assert router.supervisor.loads == 3  # chat, coder and embed, before the pressure

            release.set()
            assert (await stream).status == 200
            # The stream has ended: chat is idle now, and goes too.
            await until(lambda: len(unloads(router)) == 3, "chat unloaded once idle")
            assert unloads(router)[-1].role == "chat"
            assert router.supervisor.state("base") == "ready"

            router.memory.free_mb = 5000
            await until(lambda: len(pressure_events(router)) == 2, "pressure to end")
            assert pressure_events(router)[-1]["state"] == "left"
            again = await call(router.app, "/v1/chat/completions", chat_body("coder-model"))
            assert again.status == 200, again.body

    run(scenario())


def test_readings_between_the_floor_and_the_resume_level_change_nothing(tmp_path: Path) -> None:
    """No flapping: once below the floor, the machine stays below it (loads refused)
    until a reading reaches the resume level, however the readings wander."""
    router = pressure_router(tmp_path, asyncio.Event())

    async def scenario() -> None:
        async with serving(router):
            router.memory.free_mb = 999
            await until(lambda: len(pressure_events(router)) == 1, "pressure to begin")
            for free in (1001, 1200, 1010, 1255):
                router.memory.free_mb = free
                await readings_after(router, 2)
                refused = await call(router.app, "/v1/chat/completions", chat_body("coder-model"))
                assert refused.status == 503, (free, refused.body)
            assert len(pressure_events(router)) == 1
            router.memory.free_mb = 1256
            await until(lambda: len(pressure_events(router)) == 2, "pressure to end")
            for free in (1200, 1001):  # above the floor: pressure does not begin again
                router.memory.free_mb = free
                await readings_after(router, 2)
            assert len(pressure_events(router)) == 2
            got = await call(router.app, "/v1/chat/completions", chat_body("coder-model"))
            assert got.status == 200, got.body

    run(scenario())


def test_a_request_during_pressure_is_served_by_a_loaded_model(tmp_path: Path) -> None:
    """Pressure refuses loads, not requests: an always model and an on-demand one that
    is loaded and in use keep serving."""
    release = asyncio.Event()
    router = pressure_router(tmp_path, release)

    async def scenario() -> None:
        async with serving(router):
            stream = await start_chat_stream(router)
            router.memory.free_mb = 10
            await until(lambda: len(pressure_events(router)) == 1, "pressure to begin")
            base = await call(router.app, "/v1/chat/completions", chat_body("base-model"))
            assert base.status == 200, base.body
            second = asyncio.ensure_future(
                call(router.app, "/v1/chat/completions", chat_body("org/chat-model"))
            )
            release.set()
            assert (await stream).status == 200
            assert (await second).status == 200
            assert all(c.role != "base" for c in unloads(router))

    run(scenario())


def test_health_shows_the_free_memory_beside_the_budget(tmp_path: Path) -> None:
    router = pressure_router(tmp_path, asyncio.Event())

    async def scenario() -> None:
        async with serving(router):
            router.memory.free_mb = 4321
            await readings_after(router, 1)
            got = await call(router.app, "/health", b"", method="GET")
            memory = got.json()["memory"]
            assert memory == {
                "free_mb": 4321,
                "floor_mb": 1000,
                "resume_mb": 1256,
                "below_floor": False,
                "source": "scripted",
                "budget_mb": 100000,
                "held_mb": 300,  # base alone: the on-demand models are unloaded
            }

    run(scenario())
