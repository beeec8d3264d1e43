"""The router's own periodic tasks (the planner, the pressure watch, the registry
follower) run through one helper: turns go on after a failure, a wake cuts a wait short,
the first turn can wait, and stopping ends the task."""

from __future__ import annotations

import asyncio
import logging

import pytest

from slm_server.router.call.periodic import Periodic

LOG = logging.getLogger("slm_server.router")
FOREVER = 3600.0


def test_a_failed_turn_is_logged_and_the_next_one_runs(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> list[int]:
        turns: list[int] = []
        second = asyncio.Event()

        async def turn() -> float:
            turns.append(len(turns))
            if len(turns) == 1:
                raise RuntimeError("a bad turn")
            second.set()
            return FOREVER

        task = Periodic(turn, after_failure=lambda: 0.0, log=LOG, failure="the turn failed")
        task.start()
        await asyncio.wait_for(second.wait(), 5)
        await task.stop()
        assert not task.running
        return turns

    assert asyncio.run(scenario()) == [0, 1]
    assert [r.getMessage() for r in caplog.records] == ["the turn failed"]


def test_a_wake_runs_the_next_turn_now_and_the_first_can_wait() -> None:
    async def scenario() -> int:
        turns = 0
        ran = asyncio.Event()

        async def turn() -> float:
            nonlocal turns
            turns += 1
            ran.set()
            return FOREVER

        task = Periodic(
            turn,
            after_failure=lambda: FOREVER,
            log=LOG,
            failure="x",
            first_wait=lambda: FOREVER,
            wakeable=True,
        )
        task.start()
        await asyncio.sleep(0)  # the task's first step: it waits, no turn yet
        assert turns == 0
        for expected in (1, 2):
            ran.clear()
            task.wake()
            await asyncio.wait_for(ran.wait(), 5)
            assert turns == expected
        await task.stop()
        task.wake()  # stopped: nothing to wake, nothing raised
        return turns

    assert asyncio.run(scenario()) == 2
