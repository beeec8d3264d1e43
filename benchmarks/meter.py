"""CPU time and memory of server processes while a load level runs.

    meter = ProcessMeter({"server": router.pid, "backend": fake.pid})
    async with meter:
        run = await closed_loop(...)
    meter.result()   # {"server": {"cpu_s": ..., "cpu_share": ..., "rss_mb_peak": ...}, ...}

CPU time is user + system of the process and its children, read with psutil at the
start and the end; RSS is sampled every ``interval`` seconds and its peak kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from types import TracebackType
from typing import Any

import psutil


def _tree(process: psutil.Process) -> list[psutil.Process]:
    try:
        return [process, *process.children(recursive=True)]
    except psutil.Error:
        return [process]


def cpu_seconds(process: psutil.Process) -> float:
    total = 0.0
    for member in _tree(process):
        with contextlib.suppress(psutil.Error):
            times = member.cpu_times()
            total += times.user + times.system
    return total


def rss_mb(process: psutil.Process) -> float:
    total = 0
    for member in _tree(process):
        with contextlib.suppress(psutil.Error):
            total += member.memory_info().rss
    return total / 1e6


class ProcessMeter:
    """Measures named processes over an ``async with`` block."""

    def __init__(self, pids: dict[str, int], interval: float = 0.25) -> None:
        self.processes = {name: psutil.Process(pid) for name, pid in pids.items()}
        self.interval = interval
        self._cpu: dict[str, float] = {}
        self._peak: dict[str, float] = {}
        self._end_rss: dict[str, float] = {}
        self._wall = 0.0
        self._sampler: asyncio.Task[None] | None = None

    async def __aenter__(self) -> ProcessMeter:
        self._cpu = {name: cpu_seconds(p) for name, p in self.processes.items()}
        self._peak = {name: rss_mb(p) for name, p in self.processes.items()}
        self._wall = time.perf_counter()
        self._sampler = asyncio.ensure_future(self._sample())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._wall = time.perf_counter() - self._wall
        self._cpu = {name: cpu_seconds(p) - self._cpu[name] for name, p in self.processes.items()}
        if self._sampler is not None:
            self._sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampler
        self._end_rss = {name: rss_mb(p) for name, p in self.processes.items()}
        for name, value in self._end_rss.items():
            self._peak[name] = max(self._peak[name], value)

    async def _sample(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            for name, process in self.processes.items():
                self._peak[name] = max(self._peak[name], rss_mb(process))

    def result(self) -> dict[str, dict[str, Any]]:
        wall = self._wall or 1.0
        return {
            name: {
                "cpu_s": round(self._cpu[name], 4),
                "cpu_share": self._cpu[name] / wall,
                "rss_mb_peak": round(self._peak[name], 1),
                "rss_mb_end": round(self._end_rss[name], 1),
            }
            for name in self.processes
        }
