"""The trim after large bodies: only past the threshold, one at a time, requests that end
together coalesced into one more trim, and none where the allocator has no trim."""

from __future__ import annotations

import asyncio
import threading

from slm_server.router.intake.memory_return import THRESHOLD_BYTES, MemoryReturn, _glibc_trim


def test_small_bodies_trim_nothing_and_large_ones_trim_once_each_burst() -> None:
    entered = threading.Event()
    proceed = threading.Event()
    calls: list[int] = []

    def trim() -> None:
        calls.append(1)
        entered.set()
        proceed.wait(5)

    memory = MemoryReturn(trim)

    async def scenario() -> None:
        memory.released(THRESHOLD_BYTES - 1)
        await asyncio.sleep(0)
        assert calls == []
        memory.released(THRESHOLD_BYTES)
        await asyncio.to_thread(entered.wait, 5)
        for _ in range(5):  # a burst ending while the first trim runs: one more trim
            memory.released(THRESHOLD_BYTES * 2)
        proceed.set()
        while memory.running:
            await asyncio.sleep(0.001)

    asyncio.run(scenario())
    assert len(calls) == 2
    assert memory.trims == 2


def test_a_failing_trim_is_logged_and_the_next_one_runs() -> None:
    calls: list[int] = []

    def trim() -> None:
        calls.append(1)
        raise OSError("no")

    memory = MemoryReturn(trim)

    async def scenario() -> None:
        for _ in range(2):
            memory.released(THRESHOLD_BYTES)
            while memory.running:
                await asyncio.sleep(0.001)

    asyncio.run(scenario())
    assert len(calls) == 2


def test_glibc_has_malloc_trim_here() -> None:
    # The machines the suite runs on are glibc Linux or macOS (where there is none).
    import sys

    found = _glibc_trim()
    if sys.platform.startswith("linux"):
        assert found is not None
        found()
