"""The one module that starts, signals and reaps backend processes.

Each backend runs in its own process group (so a signal reaches anything it forks),
with stdout and stderr appended to its log file, the previous run's log kept as
``.log.prev``. On Linux a parent-death signal kills a backend whose launcher dies, even
by SIGKILL; elsewhere the launcher's pidfile lets the next start sweep leftovers.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from slm_server.launch.plan import LaunchPlan

_PR_SET_PDEATHSIG = 1


def _parent_death_signal(parent_pid: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` asking Linux to SIGKILL the child when its parent dies."""
    if not sys.platform.startswith("linux"):
        return None

    def arm() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        # The parent may have died between fork and prctl: then nobody would signal us.
        if os.getppid() != parent_pid:
            os._exit(1)

    return arm


def rotate_log(path: Path) -> None:
    """Keep the previous run's log as ``<name>.prev``; when that cannot be done (a full
    disk, a ``.prev`` that is not a file) the new run appends to the old log instead."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        with contextlib.suppress(OSError):
            path.replace(path.with_name(path.name + ".prev"))


def tail_lines(path: Path, count: int = 15) -> list[str]:
    """The last ``count`` lines of a log file (empty when it does not exist)."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 16384))
            data = handle.read()
    except OSError:
        return []
    return data.decode("utf-8", "replace").splitlines()[-count:]


@dataclass
class BackendProcess:
    """A running (or finished) backend started from ``plan``."""

    plan: LaunchPlan
    popen: subprocess.Popen[bytes]
    started_at: float
    create_time: float
    exit_status: int | None = field(default=None)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        """The exit status once the process has ended (negative: killed by that signal)."""
        if self.exit_status is None:
            self.exit_status = self.popen.poll()
        return self.exit_status

    def alive(self) -> bool:
        return self.poll() is None


def spawn(plan: LaunchPlan, env: Mapping[str, str], clock: Callable[[], float]) -> BackendProcess:
    """Start ``plan`` in its own process group, output to its log file."""
    rotate_log(plan.log_path)
    with plan.log_path.open("ab") as log:
        popen = subprocess.Popen(  # noqa: S603 - argv built from the validated registry
            list(plan.argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(env),
            start_new_session=True,
            preexec_fn=_parent_death_signal(os.getpid()),
        )
    try:
        create_time = psutil.Process(popen.pid).create_time()
    except psutil.Error:
        create_time = 0.0
    return BackendProcess(plan=plan, popen=popen, started_at=clock(), create_time=create_time)


def signal_group(pid: int, sig: int) -> None:
    """Send ``sig`` to the process group led by ``pid``; a gone group is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def kill(proc: BackendProcess) -> int | None:
    """SIGKILL the backend's group at once; returns the exit status. For a backend known
    to be wedged: a stopped (SIGSTOP) or hung process ignores SIGTERM, and waiting for
    it to stop only delays its replacement."""
    signal_group(proc.pid, signal.SIGKILL)
    if proc.exit_status is None:
        proc.exit_status = proc.popen.wait()
    return proc.exit_status


def stop_pid(pid: int, create_time: float, timeout: float) -> bool:
    """Stop a process from an earlier run, only if ``pid`` is still that process."""
    try:
        process = psutil.Process(pid)
        if abs(process.create_time() - create_time) > 0.01:
            return False
    except psutil.Error:
        return False
    signal_group(pid, signal.SIGCONT)
    signal_group(pid, signal.SIGTERM)
    with contextlib.suppress(psutil.Error):
        process.terminate()
    try:
        process.wait(timeout=timeout)
    except psutil.TimeoutExpired:
        signal_group(pid, signal.SIGKILL)
        with contextlib.suppress(psutil.Error):
            process.kill()
            process.wait(timeout=timeout)
    except psutil.Error:
        pass
    return True


@dataclass(frozen=True)
class PortHolder:
    """Who listens on a port: ``pid``, create time and command line when the OS tells."""

    pid: int | None
    command: str
    argv: tuple[str, ...] = ()
    create_time: float | None = None

    def __str__(self) -> str:
        return f"pid {self.pid} ({self.command})" if self.pid is not None else self.command


def port_holder(host: str, port: int) -> PortHolder | None:
    """``None`` when ``host:port`` can be bound, else the process holding it."""
    bind_host = "127.0.0.1" if host in ("", "localhost") else host
    family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((bind_host, port))
        except OSError as exc:
            if exc.errno not in (errno.EADDRINUSE, errno.EACCES):
                return PortHolder(None, f"cannot bind: {exc.strerror}")
        else:
            return None
    try:
        connections = psutil.net_connections(kind="inet")
    except psutil.Error:
        return PortHolder(None, "an unknown process")
    for conn in connections:
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
            if conn.pid is None:
                return PortHolder(None, "a process of another user")
            try:
                holder = psutil.Process(conn.pid)
                argv, created = tuple(holder.cmdline()), holder.create_time()
            except psutil.Error:
                argv, created = (), None
            command = (" ".join(argv) or "?")[:200]
            return PortHolder(conn.pid, command, argv, created)
    return PortHolder(None, "an unknown process")


def describe_exit(status: int | None) -> str:
    """``exit code N`` or ``killed by SIGNAME`` for a ``Popen.returncode``."""
    if status is None:
        return "still running"
    if status < 0:
        try:
            return f"killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"killed by signal {-status}"
    return f"exit code {status}"


def kill_process(pid: int, create_time: float | None, timeout: float) -> bool:
    """SIGTERM then SIGKILL one process (and its group), only while ``pid`` is still the
    process created at ``create_time``; True once it is gone."""
    if create_time is None:
        return False
    return stop_pid(pid, create_time, timeout)


def trim_log(path: Path, max_bytes: int) -> int | None:
    """When ``path`` exceeds ``max_bytes``, copy it to ``.prev`` and truncate it in
    place (the backend keeps appending to the same descriptor); returns the old size."""
    try:
        size = path.stat().st_size
    except OSError:
        return None
    if max_bytes <= 0 or size <= max_bytes:
        return None
    shutil.copyfile(path, path.with_name(path.name + ".prev"))
    with path.open("r+b") as handle:
        handle.truncate(0)
    return size


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    """Poll ``predicate`` until it holds or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
