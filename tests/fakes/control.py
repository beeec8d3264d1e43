"""Test-side helper that runs ``tests.fakes.fake_backend`` as a real process and scripts it.

with FakeBackend.start(model_id="m1") as fake:
    fake.script(chunks=4, chunk_interval_seconds=0.2)
    ...  # point the router (or a client) at fake.url
    fake.wait_for(lambda reqs: len(reqs) == 1 and reqs[0]["completed"])
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from tests.fakes.process_group import StopsOnExit, signal_group, stop_group

REPO_ROOT = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"
POLL_INTERVAL = 0.02


_HANDED_OUT: set[int] = set()
_RANDOM = random.Random()


def _worker_share() -> tuple[int, int]:
    """(this pytest-xdist worker's index, how many workers); (0, 1) outside xdist."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if worker.startswith("gw") and worker[2:].isdigit() and count.isdigit() and int(count) > 0:
        return int(worker[2:]), int(count)
    return 0, 1


def _listening_pool() -> range:
    """The ports tests hand out: below the kernel's ephemeral range, so no outgoing
    connection of any process is given one of them between the handing out and the bind."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return range(10000, max(low, 12000))


# The top of the pool is kept for runs of consecutive ports (free_ports), one contiguous
# part per worker; free_port draws from the rest.
RUNS_REGION = 1600


def _single_pool() -> range:
    pool = _listening_pool()
    return range(pool.start, pool.stop - RUNS_REGION)


def _runs_share(index: int, count: int) -> range:
    """This worker's part of the region kept for runs of consecutive ports."""
    pool = _listening_pool()
    span = RUNS_REGION // count
    start = pool.stop - RUNS_REGION + index * span
    return range(start, start + span)


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def free_ports(count: int) -> int:
    """The first of ``count`` consecutive ports on 127.0.0.1, each free a moment ago and
    none handed out before (an entry with replicas takes its port and the next ones):
    from this worker's own part of the numbers below the kernel's ephemeral range, so
    neither another worker nor an outgoing connection takes one before the bind."""
    share = _runs_share(*_worker_share())
    for _ in range(200):
        base = _RANDOM.randrange(share.start, share.stop - count + 1)
        run = range(base, base + count)
        if any(port in _HANDED_OUT for port in run) or not all(map(_bindable, run)):
            continue
        _HANDED_OUT.update(run)
        return base
    raise RuntimeError(f"no {count} consecutive free ports in this worker's share")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago and that no earlier call in
    this process returned (a registry of two entries built from two calls must not share
    one). Under pytest-xdist each worker draws only from its own share of the numbers
    (port modulo the worker count), so two workers never hand out the same port."""
    index, count = _worker_share()
    pool = _single_pool()
    for _ in range(1000):
        port = _RANDOM.randrange(pool.start, pool.stop)
        if port % count != index or port in _HANDED_OUT or not _bindable(port):
            continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError("no free port in this worker's share")


class FakeBackendError(RuntimeError):
    """The fake backend process could not be started."""


class _PortTaken(FakeBackendError):
    pass


class FakeBackend(StopsOnExit):
    """A running ``tests.fakes.fake_backend`` process; create it with ``FakeBackend.start()``."""

    def __init__(
        self, port: int, model_id: str, process: subprocess.Popen[bytes], log_path: Path
    ) -> None:
        self.port = port
        self.model_id = model_id
        self.process = process
        self.log_path = log_path
        self._final_output: str | None = None
        self._client = httpx.Client(base_url=self.url, timeout=5.0, trust_env=False)

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    def start(
        cls, port: int | None = None, model_id: str = "fake-model", *, startup_timeout: float = 15.0
    ) -> FakeBackend:
        """Spawn the fake (own process group) and wait until GET /health answers 200."""
        attempts = 1 if port is not None else 3  # a free_port() race only needs a retry
        for attempt in range(attempts):
            fake = cls._spawn(port if port is not None else free_port(), model_id)
            try:
                fake._wait_healthy(startup_timeout)
            except FakeBackendError as exc:
                output = fake.stop()
                taken = isinstance(exc, _PortTaken) or "address already in use" in output.lower()
                if taken and attempt + 1 < attempts:
                    continue
                raise FakeBackendError(f"{exc}\n--- fake backend output ---\n{output}") from None
            except BaseException:
                fake.stop()
                raise
            return fake
        raise AssertionError("unreachable")  # pragma: no cover

    @classmethod
    def _spawn(cls, port: int, model_id: str) -> FakeBackend:
        fd, name = tempfile.mkstemp(prefix=f"fake-backend-{port}-", suffix=".log")
        command = [
            sys.executable,
            "-m",
            "tests.fakes.fake_backend",
            "--port",
            str(port),
            "--host",
            HOST,
            "--model-id",
            model_id,
            "--parent-pid",
            str(os.getpid()),
        ]
        with os.fdopen(fd, "wb") as log:
            process = subprocess.Popen(
                command,
                cwd=REPO_ROOT,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        return cls(port, model_id, process, Path(name))

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise FakeBackendError(
                    f"fake backend exited with code {self.process.returncode} during startup"
                )
            try:
                response = self._client.get("/health", timeout=1.0)
            except httpx.TransportError:
                pass
            else:
                if response.headers.get("x-fake-pid") != str(self.pid):
                    raise _PortTaken(f"port {self.port} is served by another process")
                if response.status_code == 200:
                    return
            time.sleep(POLL_INTERVAL)
        raise FakeBackendError(f"fake backend not healthy on port {self.port} after {timeout}s")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the fake's process group (SIGKILL, SIGSTOP, SIGCONT, ...)."""
        signal_group(self.process, sig)

    def wait_for_exit(self, timeout: float = 5.0) -> int:
        """Wait until the process has exited and return its exit code."""
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"fake backend (pid {self.pid}) still running after {timeout}s"
            ) from None

    def stop(self, timeout: float = 5.0) -> str:
        """SIGTERM, then SIGKILL after ``timeout``; always reaps. Returns the process output."""
        self._client.close()
        stop_group(self.process, timeout)
        if self._final_output is None:
            self._final_output = self.output()
            self.log_path.unlink(missing_ok=True)
        return self._final_output

    # ------------------------------------------------------------------ properties

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        """None while running, else the exit code (negative: killed by that signal)."""
        return self.process.poll()

    def is_running(self) -> bool:
        return self.process.poll() is None

    def output(self) -> str:
        """Everything the process wrote to stdout/stderr so far."""
        if self._final_output is not None:
            return self._final_output
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    # ------------------------------------------------------------------ control API

    def script(self, **fields: Any) -> None:
        """Replace the fake's script (see ``fake_backend.Script``); no fields resets it."""
        response = self._client.post("/_control", json=fields)
        if response.status_code != 200:
            raise ValueError(f"fake backend rejected script {fields!r}: {response.text}")

    def reset(self) -> None:
        """Forget recorded requests and reset the script."""
        self._client.post("/_reset").raise_for_status()

    def requests(self) -> list[dict[str, Any]]:
        """Every proxied request received so far (see ``fake_backend.Record``)."""
        response = self._client.get("/_requests")
        response.raise_for_status()
        records: list[dict[str, Any]] = response.json()
        return records

    def health_requests(self) -> list[dict[str, Any]]:
        """Every GET /health received so far: {"received_at", "status", "stalled"}."""
        response = self._client.get("/_health_requests")
        response.raise_for_status()
        records: list[dict[str, Any]] = response.json()
        return records

    def wait_for(
        self, predicate: Callable[[list[dict[str, Any]]], bool], timeout: float = 5.0
    ) -> list[dict[str, Any]]:
        """Poll ``requests()`` until ``predicate`` holds; AssertionError after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            records = self.requests()
            if predicate(records):
                return records
            if time.monotonic() >= deadline:
                raise AssertionError(
                    f"condition not met within {timeout}s; requests seen: {records!r}"
                )
            time.sleep(POLL_INTERVAL)
