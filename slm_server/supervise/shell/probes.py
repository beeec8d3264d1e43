"""The real probes behind ``evidence.gather``: HTTP on ``slm_server.http1`` and the
OS through psutil. The one place where their exceptions become confirmation's own:

    http1.ConnectTimeout, http1.ReadTimeout, TimeoutError  -> ProbeError(TIMED_OUT)
    http1.ConnectError (refused, unreachable)               -> ProbeError(REFUSED)
    http1.ProtocolError (malformed, closed, reset)          -> ProbeError(BROKEN)

    psutil: no such pid, or another process's create time   -> GONE
            status "zombie"                                 -> ZOMBIE
            status "stopped" or "tracing-stop"              -> STOPPED
            "dead" (being reaped)                           -> GONE
            anything else (running, sleeping, disk-sleep...) -> RUNNING
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Final

import psutil

from slm_server import http1
from slm_server.contracts.records import CREATE_TIME_TOLERANCE
from slm_server.supervise.core.confirm import ProcessStatus, Reply
from slm_server.supervise.shell.evidence import ProbeError

MAX_BODY: Final = 1024 * 1024


class Http1Probe:
    """HTTP probes of the backend at ``base_url``, on a pool of their own. Bodies are
    read up to ``max_body`` bytes (the rest is dropped with the connection). Call
    :meth:`close` when done."""

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout: float = 1.0,
        max_body: int = MAX_BODY,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.pool = http1.Pool(base_url, connect_timeout=connect_timeout, read_timeout=5.0)
        self.max_body = max_body
        self.headers = dict(headers or {})  # sent with every probe (a remote's key)

    async def get(self, path: str, timeout: float) -> tuple[int, bytes]:
        return await self._exchange("GET", path, self.headers, b"", timeout)

    async def post_json(
        self, path: str, payload: Mapping[str, object], timeout: float
    ) -> tuple[int, bytes]:
        body = json.dumps(payload, separators=(",", ":")).encode()
        headers = {**self.headers, "content-type": "application/json"}
        return await self._exchange("POST", path, headers, body, timeout)

    async def _exchange(
        self, method: str, path: str, headers: Mapping[str, str], body: bytes, timeout: float
    ) -> tuple[int, bytes]:
        try:
            async with asyncio.timeout(timeout):
                response = await self.pool.request(method, path, headers, body, timeout=timeout)
                try:
                    return response.status_code, await self._read(response)
                finally:
                    response.close()
        except (http1.ConnectTimeout, http1.ReadTimeout, TimeoutError):
            raise ProbeError(Reply.TIMED_OUT, f"{path}: no answer within {timeout:.3g}s") from None
        except http1.ConnectError as exc:
            raise ProbeError(Reply.REFUSED, f"{path}: {exc}") from None
        except http1.ProtocolError as exc:
            raise ProbeError(Reply.BROKEN, f"{path}: {exc}") from None

    async def _read(self, response: http1.Response) -> bytes:
        parts: list[bytes] = []
        size = 0
        while size < self.max_body:
            piece = await response.receive()
            if not piece:
                break
            parts.append(piece)
            size += len(piece)
        return b"".join(parts)[: self.max_body]

    def close(self) -> None:
        self.pool.close()


class PsutilProbe:
    """The process's status and CPU time, from psutil."""

    def _process(self, pid: int, create_time: float | None) -> psutil.Process | None:
        try:
            process = psutil.Process(pid)
            if create_time is not None and (
                abs(process.create_time() - create_time) > CREATE_TIME_TOLERANCE
            ):
                return None
        except psutil.Error:
            return None
        return process

    def status(self, pid: int, create_time: float | None) -> ProcessStatus:
        process = self._process(pid, create_time)
        if process is None:
            return ProcessStatus.GONE
        try:
            status = process.status()
        except psutil.ZombieProcess:
            return ProcessStatus.ZOMBIE
        except psutil.Error:
            return ProcessStatus.GONE
        if status == psutil.STATUS_ZOMBIE:
            return ProcessStatus.ZOMBIE
        if status in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP):
            return ProcessStatus.STOPPED
        if status == psutil.STATUS_DEAD:
            return ProcessStatus.GONE
        return ProcessStatus.RUNNING

    def cpu_seconds(self, pid: int, create_time: float | None) -> float | None:
        process = self._process(pid, create_time)
        if process is None:
            return None
        try:
            times = process.cpu_times()
            total = times.user + times.system + times.children_user + times.children_system
            for child in process.children(recursive=True):
                try:
                    child_times = child.cpu_times()
                except psutil.Error:
                    continue  # exited meanwhile; its time moves to its parent's children_*
                total += child_times.user + child_times.system
        except psutil.Error:
            return None
        return float(total)
