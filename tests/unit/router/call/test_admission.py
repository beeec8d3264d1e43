"""A gate resized by a reloaded registry: nobody in flight or in line is dropped, a
larger limit admits waiters at once, a smaller one admits nobody until fewer are in
flight than it allows, and a shorter line refuses only newcomers."""

from __future__ import annotations

import asyncio

import pytest

from slm_server.errors import Overloaded
from slm_server.router.call.admission import Gate
from tests.unit.router.inprocess import run


async def settle() -> None:
    """Let every task that can run, run (a few turns of the loop; no time passes)."""
    for _ in range(10):
        await asyncio.sleep(0)


async def queued(gate: Gate, count: int) -> list[asyncio.Task[None]]:
    """``count`` requests waiting in line at ``gate``, in order."""
    tasks = [asyncio.ensure_future(gate.acquire(5.0)) for _ in range(count)]
    await settle()  # each takes its place in line
    assert gate.queued == count
    return tasks


def test_a_larger_limit_admits_the_waiters_in_order_at_once() -> None:
    async def scenario() -> None:
        gate = Gate("m", 1, 4)
        assert gate.try_acquire()
        first, second, third = await queued(gate, 3)
        gate.resize("m", 3, 4)
        await settle()
        assert first.done() and second.done() and not third.done()
        assert (gate.active, gate.queued) == (3, 1)
        third.cancel()

    run(scenario())


def test_a_smaller_limit_lets_the_requests_in_flight_finish_and_then_admits() -> None:
    async def scenario() -> None:
        gate = Gate("m", 3, 4)
        for _ in range(3):
            assert gate.try_acquire()
        [waiter] = await queued(gate, 1)
        gate.resize("m", 1, 4)
        assert (gate.active, gate.queued) == (3, 1)  # nobody dropped
        gate.release()
        gate.release()
        await settle()
        assert not waiter.done() and gate.active == 1  # one still over the new limit
        gate.release()
        await settle()
        assert waiter.done() and gate.active == 1
        assert not gate.try_acquire()

    run(scenario())


def test_a_shorter_line_keeps_its_waiters_and_refuses_newcomers() -> None:
    async def scenario() -> None:
        gate = Gate("m", 1, 3)
        assert gate.try_acquire()
        tasks = await queued(gate, 3)
        gate.resize("renamed", 1, 1)
        with pytest.raises(Overloaded, match="'renamed'"):
            await gate.acquire(1.0)
        assert gate.queued == 3
        for _ in range(3):
            gate.release()
            await settle()
        assert all(task.done() for task in tasks)
        assert gate.active == 1

    run(scenario())


def test_a_paused_gate_stays_paused_when_resized() -> None:
    async def scenario() -> None:
        gate = Gate("m", 1, 4)
        gate.pause()
        [waiter] = await queued(gate, 1)
        gate.resize("m", 2, 4)
        await settle()
        assert not waiter.done() and gate.active == 0
        gate.resume()
        await settle()
        assert waiter.done() and gate.active == 1

    run(scenario())
