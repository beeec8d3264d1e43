"""The pressure watch: it writes ``memory_pressure`` once when the machine goes below
the floor and once when it comes back, hands each reading's evictions to the planner
once, and keeps watching through a source or a look at the holders that fails."""

from __future__ import annotations

import asyncio
from typing import Any

from slm_server.router.ondemand.memory_fit import Holder
from slm_server.router.ondemand.memory_pressure import Floor
from slm_server.router.ondemand.pressure_watch import PressureWatch
from tests.fakes.memory import ScriptedMemory
from tests.unit.router.inprocess import FakeEvents

IDLE = Holder("lazy", "lazy-model", 400, on_demand=True, last_used=1.0)
ALWAYS = Holder("chat", "chat-model", 300, on_demand=False)


def watch(source: Any, events: FakeEvents) -> PressureWatch:
    return PressureWatch(source, Floor.of(1000), events, poll_seconds=0.01, budget_mb=5000)


def test_crossing_the_floor_is_written_once_each_way() -> None:
    events = FakeEvents()
    woken: list[bool] = []
    pressure = watch(ScriptedMemory(), events)
    pressure.bind(lambda: [ALWAYS, IDLE], lambda: woken.append(True))
    for free in (5000, 990, 980, 1200, 1300, 1100):
        pressure.observe(free, [ALWAYS, IDLE])
    states = [(e["state"], e["free_mb"]) for e in events.named("memory_pressure")]
    assert states == [("entered", 990), ("left", 1300)]
    named = {h["role"]: h["load"] for h in events.named("memory_pressure")[0]["holders"]}
    assert named == {"chat": "always", "lazy": "on_demand"}
    assert len(woken) == 6  # the planner looks after every reading


def test_each_reading_hands_its_evictions_over_once() -> None:
    events = FakeEvents()
    pressure = watch(ScriptedMemory(), events)
    pressure.observe(990, [ALWAYS, IDLE])
    assert pressure.take_evictions() == ("lazy",)
    assert pressure.take_evictions() == ()
    pressure.evicted("lazy", "lazy-model", 18002, 400)
    [evicted] = events.named("evicted_for_pressure")
    assert evicted == {
        "event": "evicted_for_pressure",
        "role": "lazy",
        "model_id": "lazy-model",
        "port": 18002,
        "memory_mb": 400,
        "free_mb": 990,
        "floor_mb": 1000,
    }


class FailingSource:
    name = "failing"

    def available_mb(self) -> int | None:
        raise OSError("no memory statistics today")


def test_a_failing_source_is_no_reading() -> None:
    events = FakeEvents()
    pressure = watch(FailingSource(), events)
    pressure.below = True

    async def scenario() -> None:
        verdict = await pressure.read()
        assert verdict.below and pressure.free_mb is None
        assert events.named("memory_pressure") == []

    asyncio.run(scenario())


def test_the_watch_outlives_a_failed_look_at_the_holders() -> None:
    events = FakeEvents()
    source = ScriptedMemory(990)
    pressure = watch(source, events)
    looks = 0

    def holders() -> list[Holder]:
        nonlocal looks
        looks += 1
        if looks == 1:
            raise KeyError("a role a reload just removed")
        return [IDLE]

    pressure.bind(holders, lambda: None)

    async def scenario() -> None:
        pressure.start()
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 5
            while pressure.readings < 2:
                assert loop.time() < deadline, "the watch stopped reading"
                await asyncio.sleep(0.005)
        finally:
            await pressure.stop()
        assert pressure.below and len(events.named("memory_pressure")) == 1
        report = pressure.report()
        assert report["free_mb"] == 990 and report["held_mb"] == 400
        assert report["below_floor"] is True and report["source"] == "scripted"

    asyncio.run(scenario())
