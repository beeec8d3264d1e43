"""Starting the gateway's own commands as real processes for integration tests."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import httpx
import yaml

from tests import one_shot
from tests.fakes import control as fake_control

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A free port on 127.0.0.1, never one handed out before in this process."""
    return fake_control.free_port()


def poll(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.05) -> None:
    """Wait until ``predicate()`` holds; fail the test with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


def http_ok(url: str) -> bool:
    try:
        return one_shot.get(url, timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            return handle.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return True


@dataclass
class Command:
    """A running ``python -m slm_server <command>`` process and its output file."""

    popen: subprocess.Popen[bytes]
    output: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def text(self) -> str:
        return self.output.read_text(encoding="utf-8", errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait()
        return self.popen.returncode


def start_command(
    command: str,
    env: Mapping[str, str],
    output: Path,
    *extra: str,
    prefix: Sequence[str] = (),
    cwd: Path = ROOT,
) -> Command:
    """Start ``python -m slm_server <command>`` in its own session, from ``cwd``'s
    ``slm_server``, under ``prefix`` when one is given (e.g. valgrind)."""
    full_env = {**os.environ, **env}
    full_env.setdefault("SLM_ENV_FILE", str(output.parent / "no.env"))
    # Saved slots stay with the test (not in the home's cache, shared by every test).
    full_env.setdefault("SLM_SLOT_CACHE_DIR", str(output.parent / "slots"))
    # The machine's free memory is not the test's: no floor unless the test sets one
    # (and then from a simulated source), so that a busy CI machine never refuses loads.
    full_env.setdefault("SLM_MEMORY_FLOOR_MB", "0")
    handle = output.open("wb")
    try:
        popen = subprocess.Popen(
            [*prefix, sys.executable, "-m", "slm_server", command, *extra],
            cwd=cwd,
            env=full_env,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    finally:
        handle.close()
    return Command(popen, output)


def registry_env(workdir: Path, models: Mapping[str, object], **extra: str) -> dict[str, str]:
    """Write ``models`` as ``workdir/models.yaml``; the environment of a router serving it
    in front of backends started by the test (no llama-server of its own)."""
    config = workdir / "models.yaml"
    config.write_text(yaml.safe_dump({"models": dict(models)}))
    return {
        "SLM_CONFIG": str(config),
        "SLM_BACKEND_LOG_DIR": str(workdir / "logs"),
        "SLM_LLAMA_SERVER_BIN": "",
        **extra,
    }


@contextlib.contextmanager
def running_router(
    env: Mapping[str, str], workdir: Path, *, cwd: Path = ROOT
) -> Iterator[tuple[Command, str]]:
    """A router on a free port, run from ``cwd``'s ``slm_server``; yields it and its base
    URL, stops it afterwards."""
    port = free_port()
    router = start_command(
        "router", {**env, "SLM_ROUTER_PORT": str(port)}, workdir / "router.out", cwd=cwd
    )
    url = f"http://127.0.0.1:{port}"
    try:
        poll(
            lambda: http_ok(f"{url}/health") or router.popen.poll() is not None,
            30,
            "the router to answer /health",
        )
        if router.popen.poll() is not None:
            raise AssertionError(f"router exited:\n{router.text()}")
        yield router, url
    finally:
        router.stop()


@dataclass
class RunningRouter:
    """A router started by the ``start_router`` fixture (tests/integration/conftest.py)."""

    command: Command
    url: str
    workdir: Path

    @property
    def pid(self) -> int:
        return self.command.pid

    @property
    def output(self) -> Path:
        """The router's stdout and stderr."""
        return self.command.output


class StartRouter(Protocol):
    """The ``start_router`` fixture: a router serving ``models`` with these ``SLM_*``
    ``settings``, from ``workdir`` (a fresh directory by default)."""

    def __call__(
        self, models: Mapping[str, object], *, workdir: Path | None = None, **settings: str
    ) -> RunningRouter: ...
