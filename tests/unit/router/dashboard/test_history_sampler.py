"""The sampler's reading of the watchdog log: the lifecycle events among its last lines
first, then those appended, other lines left out, and nothing read while the file has
not changed."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, cast

import pytest

from slm_server.router.dashboard.history import Buckets, History
from slm_server.router.dashboard.history_sampler import HistorySampler, Sources

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
