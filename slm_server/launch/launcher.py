"""The ``backends`` command: start one server process per enabled model, await each
one's readiness, report it, and stop every child on SIGINT/SIGTERM.

A backend is ready when its ``/health`` answers 200 *and* its process is alive. One
that exits before that is reported with the last lines of its log; one still loading
after ``SLM_READY_TIMEOUT_SECONDS`` is reported as such and kept.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import FrameType

import httpx

from slm_server.config import RegistryFile
from slm_server.launch import process
from slm_server.launch.plan import LaunchPlan, Toolchain, plan_registry
from slm_server.launch.records import (
    BackendState,
    PidRecord,
    read_pidfile,
    write_pidfile,
    write_state,
)
from slm_server.settings import Settings

log = logging.getLogger("slm_server.launcher")

TICK_SECONDS = 0.2


@dataclass
class Backend:
    """One planned backend and what became of it."""

    plan: LaunchPlan
    state: str = "starting"
    proc: process.BackendProcess | None = None
    reason: str | None = None
    since: float = 0.0
    loading_reported: bool = False

    def snapshot(self) -> BackendState:
        proc = self.proc
        return BackendState(
            role=self.plan.role,
            model_id=self.plan.model_id,
            backend=self.plan.backend,
            port=self.plan.port,
            state=self.state,
            pid=proc.pid if proc is not None else None,
            since=self.since,
            started_at=proc.create_time if proc is not None else None,
            exit_status=proc.exit_status if proc is not None else None,
            restarts=0,
            reason=self.reason,
            log_path=str(self.plan.log_path),
        )


def describe_exit(status: int | None) -> str:
    if status is None:
        return "still running"
    if status < 0:
        try:
            return f"killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"killed by signal {-status}"
    return f"exit code {status}"


class Launcher:
    """Starts the registry's backends and owns them until told to stop."""

    def __init__(
        self,
        settings: Settings,
        registry: RegistryFile,
        env: Mapping[str, str],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.env = env
        self.clock = clock
        self.stopping = threading.Event()
        self.backends: list[Backend] = []
        self.failed_plans = 0

    def request_stop(self, signum: int, _frame: FrameType | None = None) -> None:
        log.info("received %s: stopping backends", signal.Signals(signum).name)
        self.stopping.set()

    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self.request_stop)

    def sweep_leftovers(self) -> None:
        """Stop processes a previous launcher started and could not stop (it was
        SIGKILLed on a platform without parent-death signals)."""
        for record in read_pidfile(self.settings.pidfile_path):
            if process.stop_pid(record.pid, record.create_time, self.settings.stop_timeout_seconds):
                log.warning(
                    "stopped leftover backend %s (pid %d, port %d) from a previous run",
                    record.model_id,
                    record.pid,
                    record.port,
                )

    def publish(self) -> None:
        pid = os.getpid()
        write_state(self.settings.state_path, pid, [b.snapshot() for b in self.backends])
        records = [
            PidRecord(
                pid=b.proc.pid,
                create_time=b.proc.create_time,
                port=b.plan.port,
                role=b.plan.role,
                model_id=b.plan.model_id,
                argv=list(b.plan.argv),
            )
            for b in self.backends
            if b.proc is not None and b.proc.alive()
        ]
        write_pidfile(self.settings.pidfile_path, pid, records)

    def set_state(self, backend: Backend, state: str, reason: str | None = None) -> None:
        backend.state, backend.reason, backend.since = state, reason, time.time()

    def start(self) -> None:
        """Plan every enabled entry and spawn the ones that can run."""
        for warning in self.registry.warnings:
            log.warning("%s", warning)
        tools = Toolchain.discover(self.settings.llama_server_bin)
        plans, failures = plan_registry(self.registry, tools, self.settings.log_dir)
        for _spec, error in failures:
            for problem in error.problems:
                log.error("not starting: %s", problem)
        self.failed_plans = len(failures)
        for plan in plans:
            backend = Backend(plan=plan, since=time.time())
            self.backends.append(backend)
            holder = process.port_holder(plan.host, plan.port)
            if holder is not None:
                self.set_state(backend, "failed", f"port {plan.port} is in use by {holder}")
                log.error(
                    "%s (%s): port %d is in use by %s", plan.role, plan.model_id, plan.port, holder
                )
                continue
            backend.proc = process.spawn(plan, self.env, self.clock)
            log.info(
                "starting %s (%s) on %s:%d, pid %d, log %s",
                plan.role,
                plan.model_id,
                plan.host,
                plan.port,
                backend.proc.pid,
                plan.log_path,
            )
        self.publish()

    def check_readiness(self, client: httpx.Client, backend: Backend) -> bool:
        """Advance a starting backend; True when its state changed."""
        proc, plan = backend.proc, backend.plan
        assert proc is not None
        if not proc.alive():
            tail = process.tail_lines(plan.log_path)
            reason = f"{describe_exit(proc.exit_status)} while loading"
            self.set_state(backend, "failed", reason)
            log.error(
                "%s (%s) failed: %s; last lines of %s:\n%s",
                plan.role,
                plan.model_id,
                reason,
                plan.log_path,
                "\n".join(f"    {line}" for line in tail),
            )
            return True
        try:
            ok = client.get(plan.health_url).status_code == 200
        except httpx.HTTPError:
            ok = False
        elapsed = self.clock() - proc.started_at
        if ok and proc.alive():
            self.set_state(backend, "ready")
            log.info(
                "%s (%s) is ready on port %d after %.1fs",
                plan.role,
                plan.model_id,
                plan.port,
                elapsed,
            )
            return True
        if elapsed > self.settings.ready_timeout_seconds and not backend.loading_reported:
            backend.loading_reported = True
            log.warning(
                "%s (%s) is still loading after %.0fs (see %s)",
                plan.role,
                plan.model_id,
                elapsed,
                plan.log_path,
            )
        return False

    def check_exits(self, backend: Backend) -> bool:
        proc, plan = backend.proc, backend.plan
        assert proc is not None
        if proc.alive():
            return False
        reason = describe_exit(proc.exit_status)
        self.set_state(backend, "exited", reason)
        log.error("%s (%s) exited: %s; see %s", plan.role, plan.model_id, reason, plan.log_path)
        return True

    def running(self) -> list[Backend]:
        return [b for b in self.backends if b.state in ("starting", "ready")]

    def watch(self) -> int:
        """Follow the backends until a stop signal (0) or until none is left (1)."""
        with httpx.Client(timeout=self.settings.health_probe_timeout_seconds) as client:
            while not self.stopping.is_set():
                changed = False
                for backend in self.running():
                    if backend.state == "starting":
                        changed |= self.check_readiness(client, backend)
                    else:
                        changed |= self.check_exits(backend)
                if changed:
                    self.publish()
                if not self.running():
                    log.error("no backend is running")
                    return 1
                self.stopping.wait(TICK_SECONDS)
        return 0

    def stop_all(self) -> None:
        for backend in self.backends:
            if backend.proc is not None and backend.proc.alive():
                status = process.stop(backend.proc, self.settings.stop_timeout_seconds)
                log.info(
                    "stopped %s (%s): %s",
                    backend.plan.role,
                    backend.plan.model_id,
                    describe_exit(status),
                )
            if backend.state in ("starting", "ready"):
                self.set_state(backend, "stopped")
        self.publish()

    def run(self) -> int:
        """Start, watch, stop; the exit status of the ``backends`` command."""
        self.install_signal_handlers()
        self.sweep_leftovers()
        try:
            self.start()
            if not self.running():
                log.error("nothing could be started")
                return 1
            return self.watch()
        finally:
            self.stop_all()
