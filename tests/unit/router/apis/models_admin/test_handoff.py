"""The hand-off from a pull's worker thread to the event loop: in order, progress
coalesced, bounded whatever the reader does, and never stuck once the reader has gone."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from slm_server.pull.errors import PullError
from slm_server.pull.events import FileReady, Progress
from slm_server.pull.result import Pulled
from slm_server.router.apis.models_admin.handoff import Handoff, Item


def progress(name: str, done: int) -> Progress:
    return Progress(name, done, 100, 0, None, None)


def ready(name: str) -> FileReady:
    return FileReady(name, Path("/m") / name, True)


def test_progress_is_coalesced_in_place_and_the_rest_kept_in_order() -> None:
    async def main() -> list[Item]:
        handoff = Handoff(asyncio.get_running_loop())
        for event in (progress("a", 1), progress("b", 1), progress("a", 2), ready("a")):
            handoff.put(event)
        handoff.end(Pulled("r", (Path("/m/a"),)))
        return await handoff.take()

    assert asyncio.run(main()) == [
        progress("a", 2),
        progress("b", 1),
        ready("a"),
        Pulled("r", (Path("/m/a"),)),
    ]


def test_a_full_handoff_drops_new_progress_and_holds_the_worker_until_read() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        waiting = threading.Event()
        handoff = Handoff(loop, limit=2, on_wait=waiting.set)
        handoff.put(ready("a"))
        handoff.put(ready("b"))
        handoff.put(progress("c", 5))  # no room: dropped, never waits
        assert not waiting.is_set()
        worker = threading.Thread(target=handoff.put, args=(ready("c"),))
        worker.start()
        assert await asyncio.to_thread(waiting.wait, 10)
        assert worker.is_alive()
        assert await handoff.take() == [ready("a"), ready("b")]
        await asyncio.to_thread(worker.join, 10)
        assert not worker.is_alive()
        assert await handoff.take() == [ready("c")]

    asyncio.run(main())


def test_a_reader_that_leaves_frees_a_waiting_worker_and_drops_what_follows() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        waiting = threading.Event()
        handoff = Handoff(loop, limit=1, on_wait=waiting.set)
        handoff.put(ready("a"))
        worker = threading.Thread(target=handoff.put, args=(ready("b"),))
        worker.start()
        assert await asyncio.to_thread(waiting.wait, 10)
        handoff.close()
        await asyncio.to_thread(worker.join, 10)
        assert not worker.is_alive()
        handoff.put(ready("c"))
        handoff.end(PullError("cancelled", "gone"))
        assert handoff.closed
        assert await handoff.take() == []

    asyncio.run(main())


def test_take_waits_for_the_worker_or_its_timeout() -> None:
    async def main() -> None:
        handoff = Handoff(asyncio.get_running_loop())
        assert await handoff.take(timeout=0.01) == []
        worker = threading.Thread(target=handoff.end, args=(PullError("not_found", "no"),))
        worker.start()
        got = await handoff.take(timeout=10)
        await asyncio.to_thread(worker.join, 10)
        assert [type(item) for item in got] == [PullError]

    asyncio.run(main())


def test_a_put_after_the_loop_closed_is_dropped() -> None:
    loop = asyncio.new_event_loop()
    handoff = Handoff(loop)
    loop.close()
    handoff.put(ready("a"))  # no loop to wake: the reader is gone
    assert handoff.closed
