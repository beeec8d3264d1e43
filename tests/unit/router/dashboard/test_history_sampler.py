"""The sampler's reading of the watchdog log: the lifecycle events among its last lines
first, then those appended, other lines left out, nothing read while the file has not
changed, each event answered once to a page that polls with ``since``, and a read that
fails or is slow costing no sample."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any, cast

import pytest

from slm_server.contracts.events import utc_timestamp
from slm_server.router.dashboard import history_sampler
from slm_server.router.dashboard.history import Buckets, History, Snapshot
from slm_server.router.dashboard.history_sampler import HistorySampler, Sources
from slm_server.router.dashboard.log_tail import CHUNK_BYTES, Follower

BUCKETS = Buckets((1.0,), (1.0,), (1.0,))


def line(event: str, n: int) -> bytes:
    record = {"ts": f"2026-12-01T00:00:{n:02d}.000Z", "event": event, "role": "chat"}
    return (json.dumps(record) + "\n").encode()


def append(path: Path, data: bytes) -> None:
    with path.open("ab") as handle:
        handle.write(data)


def test_the_log_is_followed_for_lifecycle_events_and_read_only_when_it_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "watchdog.jsonl"
    append(log, line("backend_exited", 1) + b"junk\n" + line("memory_grew", 2))
    history = History(10, BUCKETS, max_events=8)
    # The sources are not read by follow(): only the history and the log are.
    sampler = HistorySampler(history, cast(Sources, None), log, 1.0)
    reads: list[Any] = []
    real = asyncio.to_thread

    async def counted(func: Any, /, *args: Any) -> Any:
        reads.append(func)
        return await real(func, *args)

    monkeypatch.setattr(asyncio, "to_thread", counted)  # as the sampler calls it

    async def scenario() -> None:
        await sampler.follow()
        assert [e.event for e in history.events] == ["backend_exited"]
        await sampler.follow()
        await sampler.follow()
        assert len(reads) == 1  # the start; unchanged since: a stat each, no read
        append(log, line("restart_started", 3) + line("cache_saved", 4))
        append(log, line("restart_succeeded", 5)[:10])  # half a line: not yet
        await sampler.follow()
        assert [e.event for e in history.events] == ["backend_exited", "restart_started"]
        append(log, line("restart_succeeded", 5)[10:])
        await sampler.follow()
        assert [e.event for e in history.events][-1] == "restart_succeeded"
        assert history.events[-1].mark == "restart"
        assert len(reads) == 3

    asyncio.run(asyncio.wait_for(scenario(), 10))


def test_an_event_read_a_turn_late_reaches_a_page_asking_since_its_last_sample(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More log than a turn reads: the event at its end, written before the next sample,
    is read a sample later. A page that asks for what is newer than its last sample
    still gets it, and only once."""
    log = tmp_path / "watchdog.jsonl"
    log.write_bytes(b"")
    epoch = 1_765_000_000.0
    walls = iter([epoch, epoch + 5, epoch + 10])
    history = History(10, BUCKETS)
    sampler = HistorySampler(
        history, cast(Sources, None), log, 5.0, clock=lambda: 0.0, wall=lambda: next(walls)
    )
    # The router's figures are not what this is about: an empty sample at each turn.
    monkeypatch.setattr(
        history_sampler, "snapshot", lambda _sources, clock, wall: Snapshot(wall, clock)
    )
    monkeypatch.setattr(history_sampler, "MAX_READS_PER_TURN", 1)  # one chunk a turn
    filler = line("memory_grew", 0) * (CHUNK_BYTES // len(line("memory_grew", 0)) + 1)
    restarted = {"ts": utc_timestamp(epoch + 2), "event": "restart_succeeded", "role": "chat"}
    seen: list[str] = []

    def page_polls(since: float) -> float:
        answer = history.answer(since)
        seen.extend(e["event"] for e in answer["events"])
        return float(answer["times"][-1]) if answer["times"] else since

    async def scenario() -> None:
        await sampler._turn()
        since = page_polls(0.0)
        append(log, filler + (json.dumps(restarted) + "\n").encode())
        await sampler._turn()  # reads the filler's first chunk only
        since = page_polls(since)
        assert seen == []
        await sampler._turn()  # reads the rest: the event, older than the last sample
        since = page_polls(since)
        page_polls(since)
        assert seen == ["restart_succeeded"]

    asyncio.run(asyncio.wait_for(scenario(), 10))


def test_a_named_pipe_in_place_of_the_log_is_not_waited_on(tmp_path: Path) -> None:
    """Opening a FIFO to read waits for a writer: the worker thread would be held for
    good, and the samples with it. It is passed over as a file with nothing to read."""
    fifo = tmp_path / "watchdog.jsonl"
    os.mkfifo(fifo)
    history = History(10, BUCKETS)
    sampler = HistorySampler(history, cast(Sources, None), fifo, 1.0)

    async def scenario() -> None:
        try:
            await asyncio.wait_for(sampler.follow(), 2)  # the first look: its last lines
            await asyncio.wait_for(sampler.follow(), 2)  # and then what was appended
        finally:
            # A writer comes and goes, so that a read blocked in open() ends.
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        assert list(history.events) == []

    asyncio.run(scenario())


def events(history: History, since: float | None = None) -> list[str]:
    return [e["event"] for e in history.answer(since)["events"]]


def test_a_read_of_the_log_that_fails_costs_no_sample_and_is_logged_once_a_minute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    log = tmp_path / "watchdog.jsonl"
    append(log, line("backend_exited", 1))
    history = History(20, BUCKETS)
    now = [0.0]
    sampler = HistorySampler(history, cast(Sources, None), log, 5.0, clock=lambda: now[0])
    monkeypatch.setattr(
        history_sampler, "snapshot", lambda _sources, clock, wall: Snapshot(wall, clock)
    )
    real = history_sampler._polled

    def failing(_follower: Follower) -> Any:
        raise OSError(errno.EIO, "Input/output error")

    async def turns(count: int) -> None:
        for _ in range(count):
            await sampler._turn()
            now[0] += 5.0

    def complaints() -> int:
        return sum("could not read" in r.getMessage() for r in caplog.records)

    async def scenario() -> None:
        await turns(1)
        monkeypatch.setattr(history_sampler, "_polled", failing)
        append(log, line("restart_started", 2))
        await turns(5)
        assert len(history.answer()["times"]) == 6
        assert complaints() == 1  # the same failure again within the minute: not logged
        now[0] += 60.0
        await turns(1)
        assert complaints() == 2
        monkeypatch.setattr(history_sampler, "_polled", real)
        await turns(1)
        assert len(history.answer()["times"]) == 8
        assert events(history) == ["backend_exited", "restart_started"]
        assert "reads" in caplog.records[-1].getMessage()

    with caplog.at_level(logging.INFO, logger="slm_server.router"):
        asyncio.run(asyncio.wait_for(scenario(), 10))


def test_a_slow_read_of_the_log_costs_no_sample(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read that does not end (a file system that hangs) holds no sample: the turn
    takes its sample after a short wait, starts no second read while the first is under
    way, and the events of the read go with the sample taken after it ends."""
    log = tmp_path / "watchdog.jsonl"
    append(log, line("backend_exited", 1))
    history = History(20, BUCKETS)
    sampler = HistorySampler(history, cast(Sources, None), log, 0.05)
    monkeypatch.setattr(
        history_sampler, "snapshot", lambda _sources, clock, wall: Snapshot(wall, clock)
    )
    release = threading.Event()
    reads: list[Follower] = []
    real = history_sampler._polled

    def slow(follower: Follower) -> Any:
        reads.append(follower)
        release.wait(30)
        return real(follower)

    monkeypatch.setattr(history_sampler, "_polled", slow)

    async def scenario() -> None:
        try:
            await sampler._turn()
            append(log, line("restart_started", 2))
            await sampler._turn()  # the read hangs: the sample is taken all the same
            await sampler._turn()
            assert len(history.answer()["times"]) == 3
            assert events(history) == ["backend_exited"]
            assert len(reads) == 1
        finally:
            release.set()
        sampler.interval = 30.0  # this turn waits for the read to end
        monkeypatch.setattr(history_sampler, "MAX_READ_WAIT_SECONDS", 30.0)
        await sampler._turn()
        times = history.answer()["times"]
        assert len(times) == 4
        assert events(history, since=times[-2]) == ["restart_started"]
        await sampler.stop()

    asyncio.run(asyncio.wait_for(scenario(), 20))
