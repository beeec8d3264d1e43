"""The supervisor's one seam to the operating system and the backends' HTTP: spawn,
signal, reap, who holds a port, health probes, log housekeeping. The shell
(:mod:`slm_server.supervise.supervisor`) does all its I/O through a
:class:`ProcessControl`; tests pass a fake one and start no process.

:class:`RealControl` is the real thing, on :mod:`slm_server.launch.process` and the
project's HTTP/1.1 client (:mod:`slm_server.http1`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

from slm_server.launch import process
from slm_server.launch.plan import LaunchPlan
from slm_server.memory import measure
from slm_server.registry import remote
from slm_server.registry.schema import ModelEntry
from slm_server.supervise.core.confirm import Evidence
from slm_server.supervise.core.confirm import Probe as ConfirmProbe
from slm_server.supervise.shell.evidence import (
    MonotonicClock,
    ProbeError,
    Target,
    gather,
    gather_remote,
)
from slm_server.supervise.shell.probes import Http1Probe, PsutilProbe


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

    async def probe(self, base_url: str, path: str, timeout: float) -> bool:
        """Whether ``GET path`` on ``base_url`` answered 200 within ``timeout``."""
        ...

    async def post_json(
        self, base_url: str, path: str, payload: Mapping[str, object], timeout: float
    ) -> tuple[int, bytes]:
        """``POST path`` with a JSON body: the status and body; :class:`ProbeError` when
        there is no answer within ``timeout``."""
        ...

    async def gather_evidence(
        self, base_url: str, target: Target, budget_seconds: float
    ) -> Evidence:
        """What the backend itself says about a trip (process state, CPU progress,
        ``/health``, ``/slots``, a canary), within ``budget_seconds``."""
        ...

    def trim_log(self, path: Path, max_bytes: int) -> int | None: ...

    def tail(self, path: Path, count: int) -> list[str]: ...

    async def probe_remote(
        self, entry: ModelEntry, budget_seconds: float
    ) -> tuple[ConfirmProbe, ConfirmProbe]:
        """A remote's model list and canary, with its key (see ``evidence.gather_remote``)."""
        ...

    def resident_mb(self, pid: int) -> int | None:
        """The resident memory of the process tree ``pid`` leads, None once gone."""
        ...

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
        self._probes: dict[str, Http1Probe] = {}

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

    def _http(self, base_url: str) -> Http1Probe:
        """The backend's HTTP probe, kept for the health probes and confirmations."""
        http = self._probes.get(base_url)
        if http is None:
            http = Http1Probe(base_url, connect_timeout=min(self.connect_timeout, 1.0))
            self._probes[base_url] = http
        return http

    async def probe(self, base_url: str, path: str, timeout: float) -> bool:
        try:
            status, _body = await self._http(base_url).get(path, timeout)
        except ProbeError:
            return False
        return status == 200

    async def post_json(
        self, base_url: str, path: str, payload: Mapping[str, object], timeout: float
    ) -> tuple[int, bytes]:
        return await self._http(base_url).post_json(path, payload, timeout)

    async def gather_evidence(
        self, base_url: str, target: Target, budget_seconds: float
    ) -> Evidence:
        http = self._http(base_url)
        return await gather(target, http, PsutilProbe(), budget_seconds, MonotonicClock())

    def trim_log(self, path: Path, max_bytes: int) -> int | None:
        return process.trim_log(path, max_bytes)

    def tail(self, path: Path, count: int) -> list[str]:
        return process.tail_lines(path, count)

    def resident_mb(self, pid: int) -> int | None:
        return measure.resident_mb(pid)

    async def probe_remote(
        self, entry: ModelEntry, budget_seconds: float
    ) -> tuple[ConfirmProbe, ConfirmProbe]:
        # One probe per remote and key: two entries on one server may use two keys.
        where = f"{entry.origin} {entry.api_key_env or ''}"
        http = self._probes.get(where)
        if http is None:
            headers = remote.auth_headers(entry, self.env)
            connect = min(self.connect_timeout, 5.0)
            http = Http1Probe(entry.origin, connect_timeout=connect, headers=headers)
            self._probes[where] = http
        model, prefix = entry.upstream_model, entry.path_prefix
        clock = MonotonicClock()
        return await gather_remote(http, entry.model_type, model, prefix, budget_seconds, clock)

    async def aclose(self) -> None:
        for http in self._probes.values():
            http.close()
        self._probes.clear()
