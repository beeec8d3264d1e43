"""The supervisor's one seam to the operating system and the backends' HTTP: spawn,
signal, reap, who holds a port, health probes, log housekeeping. The shell
(:mod:`slm_server.supervise.supervisor`) does all its I/O through a
:class:`ProcessControl`; tests pass a fake one and start no process.

:class:`RealControl` is the real thing, on :mod:`slm_server.launch.process` and the
project's HTTP/1.1 client (:mod:`slm_server.http1`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

from slm_server import http1
from slm_server.launch import process
from slm_server.launch.plan import LaunchPlan
from slm_server.supervise.confirm import Evidence
from slm_server.supervise.evidence import MonotonicClock, Target, gather
from slm_server.supervise.probes import Http1Probe, PsutilProbe

PROBE_BODY_LIMIT = 64 * 1024


class Child(Protocol):
    """A backend process the supervisor started."""

    @property
    def pid(self) -> int: ...

    @property
    def create_time(self) -> float: ...

    @property
    def started_at(self) -> float: ...

    @property
    def exit_status(self) -> int | None: ...

    def poll(self) -> int | None:
        """The exit status once the process has ended (negative: killed by that
        signal); ``None`` while it runs. Never blocks."""
        ...


class ProcessControl(Protocol):
    """Every OS and HTTP call the supervisor makes. Only :meth:`stop_leftover` and
    :meth:`kill_stray` may block (the shell runs them off its loop)."""

    def spawn(self, plan: LaunchPlan) -> Child: ...

    def signal_group(self, pid: int, sig: int) -> None:
        """Send ``sig`` to the process group ``pid`` leads; a gone group is fine."""
        ...

    def port_holder(self, host: str, port: int) -> process.PortHolder | None: ...

    def kill_stray(self, pid: int, create_time: float | None, timeout: float) -> bool:
        """SIGTERM then SIGKILL a process holding a port, only while it is still the
        process created at ``create_time``; True once it is gone."""
        ...

    def port_free_within(self, host: str, port: int, timeout: float) -> bool: ...

    def stop_leftover(self, pid: int, create_time: float, timeout: float) -> bool:
        """Stop a backend an earlier launcher left, only if ``pid`` is still it."""
        ...

    async def probe(self, url: str, timeout: float) -> bool:
        """Whether ``GET url`` answered 200 within ``timeout``."""
        ...

    async def gather_evidence(
        self, base_url: str, target: Target, budget_seconds: float
    ) -> Evidence:
        """What the backend itself says about a trip (process state, CPU progress,
        ``/health``, ``/slots``, a canary), within ``budget_seconds``."""
        ...

    def trim_log(self, path: Path, max_bytes: int) -> int | None: ...

    def tail(self, path: Path, count: int) -> list[str]: ...

    async def aclose(self) -> None: ...


class RealControl:
    """:class:`ProcessControl` on the real OS."""

    def __init__(
        self,
        env: Mapping[str, str],
        connect_timeout: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.env = env
        self.connect_timeout = connect_timeout
        self.clock = clock
        self._pools: dict[str, http1.Pool] = {}

    def spawn(self, plan: LaunchPlan) -> Child:
        return process.spawn(plan, self.env, self.clock)

    def signal_group(self, pid: int, sig: int) -> None:
        process.signal_group(pid, sig)

    def port_holder(self, host: str, port: int) -> process.PortHolder | None:
        return process.port_holder(host, port)

    def kill_stray(self, pid: int, create_time: float | None, timeout: float) -> bool:
        return process.kill_process(pid, create_time, timeout)

    def port_free_within(self, host: str, port: int, timeout: float) -> bool:
        return process.wait_until(lambda: process.port_holder(host, port) is None, timeout)

    def stop_leftover(self, pid: int, create_time: float, timeout: float) -> bool:
        return process.stop_pid(pid, create_time, timeout)

    def _pool(self, base: str, timeout: float) -> http1.Pool:
        pool = self._pools.get(base)
        if pool is None:
            pool = http1.Pool(
                base, connect_timeout=min(self.connect_timeout, timeout), read_timeout=timeout
            )
            self._pools[base] = pool
        return pool

    async def probe(self, url: str, timeout: float) -> bool:
        scheme, _, rest = url.partition("://")
        host, slash, path = rest.partition("/")
        pool = self._pool(f"{scheme}://{host}", timeout)
        try:
            async with asyncio.timeout(timeout):
                response = await pool.request("GET", slash + path, timeout=timeout)
                try:
                    # A health answer is small; a backend that sends more is cut off.
                    size = 0
                    while size <= PROBE_BODY_LIMIT and (piece := await response.receive()):
                        size += len(piece)
                finally:
                    await response.aclose()
        except (http1.HttpError, TimeoutError):
            return False
        return response.status_code == 200

    async def gather_evidence(
        self, base_url: str, target: Target, budget_seconds: float
    ) -> Evidence:
        http = Http1Probe(base_url, connect_timeout=min(self.connect_timeout, 1.0))
        try:
            return await gather(target, http, PsutilProbe(), budget_seconds, MonotonicClock())
        finally:
            http.close()

    def trim_log(self, path: Path, max_bytes: int) -> int | None:
        return process.trim_log(path, max_bytes)

    def tail(self, path: Path, count: int) -> list[str]:
        return process.tail_lines(path, count)

    async def aclose(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
