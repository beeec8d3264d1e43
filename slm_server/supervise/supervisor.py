"""The ``backends`` command: start one server process per enabled model, watch each
one, restart dead or wedged ones within a bounded budget, and stop them all on
SIGINT/SIGTERM. Every decision goes to the watchdog log.

Each tick (``TICK_SECONDS``) checks readiness and process exits; each sweep
(``SLM_WATCHDOG_SWEEP_SECONDS``) takes the router's restart requests and trims oversized
backend logs. A backend is ready when its ``/health`` answers 200 *and* its process is
alive.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from types import FrameType

import httpx

from slm_server.config import RegistryFile
from slm_server.launch import process
from slm_server.launch.plan import LaunchPlan, PlanError, Toolchain, plan_launch
from slm_server.launch.records import (
    PidRecord,
    read_pidfile,
    write_pidfile,
    write_state,
)
from slm_server.settings import Settings
from slm_server.supervise.backend import Backend
from slm_server.supervise.budget import RestartBudget
from slm_server.supervise.classify import FailureClass
from slm_server.supervise.events import EventLog
from slm_server.supervise.requests import RestartRequest, is_stale, take_requests
from slm_server.supervise.states import RUNNING, State, check_transition
from slm_server.supervise.strays import verifiably_ours

log = logging.getLogger("slm_server.supervisor")

TICK_SECONDS = 0.2
# Restart reasons as bounded metric labels; a failed launch's message is not one.
RESTART_REASONS = frozenset({"exited", "exited while starting"} | {f.value for f in FailureClass})
# Restarts of a backend that is alive but does not answer: it is killed at once.
WEDGED_REASONS = frozenset({FailureClass.STALL.value, FailureClass.TIMEOUT.value})


class Supervisor:
    """Owns every backend process of one registry, from start to stop."""

    def __init__(
        self,
        settings: Settings,
        registry: RegistryFile,
        env: Mapping[str, str],
        events: EventLog | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.watchdog = settings.watchdog
        self.registry = registry
        self.env = env
        self.events = events or EventLog(settings.watchdog.log_path)
        self.clock = clock
        self.wall = wall
        self.stopping = threading.Event()
        self.tools = Toolchain.discover(settings.llama_server_bin)
        self.backends: list[Backend] = []
        self.previous_records: list[PidRecord] = []
        self.dirty = True

    # -- signals and records --------------------------------------------------------

    def request_stop(self, signum: int, _frame: FrameType | None = None) -> None:
        log.info("received %s: stopping backends", signal.Signals(signum).name)
        self.stopping.set()

    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self.request_stop)

    def sweep_leftovers(self) -> None:
        """Stop processes an earlier launcher started and could not stop (it was
        SIGKILLed where there is no parent-death signal): only those whose pid *and*
        create time still match the pidfile."""
        self.previous_records = read_pidfile(self.settings.pidfile_path)
        for record in self.previous_records:
            if process.stop_pid(record.pid, record.create_time, self.settings.stop_timeout_seconds):
                log.warning(
                    "stopped leftover backend %s (pid %d, port %d) from a previous run",
                    record.model_id,
                    record.pid,
                    record.port,
                )

    def publish(self) -> None:
        """Write the state file and pidfile when anything changed."""
        if not self.dirty:
            return
        self.dirty = False
        pid = os.getpid()
        log_dir = str(self.settings.log_dir)
        write_state(self.settings.state_path, pid, [b.snapshot(log_dir) for b in self.backends])
        records = [
            PidRecord(
                pid=b.proc.pid,
                create_time=b.proc.create_time,
                port=b.spec.entry.port,
                role=b.role,
                model_id=b.spec.entry.id,
                argv=list(b.proc.plan.argv),
            )
            for b in self.backends
            if b.proc is not None and b.proc.alive()
        ]
        write_pidfile(self.settings.pidfile_path, pid, records)

    def set_state(self, backend: Backend, state: State, reason: str | None = None) -> None:
        backend.state = check_transition(backend.state, state)
        backend.reason = reason
        backend.since = self.wall()
        self.dirty = True

    # -- launching ------------------------------------------------------------------

    def is_ours(self, holder: process.PortHolder, plan: LaunchPlan) -> bool:
        """Whether the process holding the port is one this supervisor (or the one
        before it) started."""
        known = [(r.pid, r.create_time) for r in self.previous_records]
        known += [(b.proc.pid, b.proc.create_time) for b in self.backends if b.proc is not None]
        return verifiably_ours(holder.pid, holder.create_time, holder.argv, known, plan.argv)

    def free_port(self, backend: Backend, plan: LaunchPlan) -> bool:
        """Make sure the backend's port is free; kill a holder only if it is ours."""
        holder = process.port_holder(plan.host, plan.port)
        if holder is None:
            return True
        if not self.is_ours(holder, plan):
            self.events.emit(
                "stray_kill_refused",
                **backend.ids(),
                pid=holder.pid,
                command=holder.command,
                reason="the process holding the port is not one slm_server started",
            )
            backend.reason = f"port {plan.port} is in use by {holder}"
            return False
        assert holder.pid is not None
        process.kill_process(holder.pid, holder.create_time, self.settings.stop_timeout_seconds)
        freed = process.wait_until(
            lambda: process.port_holder(plan.host, plan.port) is None,
            self.settings.stop_timeout_seconds,
        )
        self.events.emit(
            "port_stray_killed",
            **backend.ids(),
            pid=holder.pid,
            command=holder.command,
            freed=freed,
        )
        return freed

    def launch(self, backend: Backend) -> bool:
        """Plan and spawn the backend; False (with ``backend.reason``) when it cannot."""
        spec = backend.spec
        try:
            plan = plan_launch(spec, self.tools, self.settings.log_dir, str(self.registry.path))
        except PlanError as exc:
            backend.reason = "; ".join(p.message for p in exc.problems)
            backend.retry_launch = exc.missing
            if exc.missing:
                problem = exc.problems[0]
                self.events.emit(
                    "model_path_missing",
                    **backend.ids(),
                    field=problem.field,
                    reason=problem.message,
                )
            else:
                for problem in exc.problems:
                    log.error("not starting: %s", problem)
            return False
        backend.plan = plan
        backend.retry_launch = True
        if not self.free_port(backend, plan):
            log.error("%s (%s): %s", spec.role, spec.entry.id, backend.reason)
            return False
        backend.proc = process.spawn(plan, self.env, self.clock)
        backend.started_wall = self.wall()
        backend.loading_reported = False
        log.info(
            "starting %s (%s) on %s:%d, pid %d, log %s",
            spec.role,
            spec.entry.id,
            plan.host,
            plan.port,
            backend.proc.pid,
            plan.log_path,
        )
        self.dirty = True
        return True

    def retryable(self, backend: Backend) -> bool:
        """Whether a failed launch may be retried: the watchdog is on and the reason is
        one time can change (an exit, a missing model path, a taken port)."""
        return self.watchdog.enabled and backend.retry_launch

    def start(self) -> None:
        """Start every enabled entry; record disabled ones."""
        self.events.emit(
            "supervisor_started",
            pid=os.getpid(),
            config=str(self.registry.path),
            models=[m.entry.id for m in self.registry.enabled],
            **self.watchdog.tunables(),
            stop_timeout_seconds=self.settings.stop_timeout_seconds,
            ready_timeout_seconds=self.settings.ready_timeout_seconds,
        )
        for warning in self.registry.warnings:
            log.warning("%s", warning)
        short = [
            s.entry.id
            for s in self.registry.enabled
            if s.entry.default_timeout <= self.watchdog.stall_seconds
        ]
        if self.watchdog.enabled and short:
            log.info(
                "the %gs first-byte stall outlasts default_timeout for %s: a silent backend "
                "there is caught by %d consecutive timeouts (lower "
                "SLM_WATCHDOG_STALL_SECONDS to catch it on the first stream)",
                self.watchdog.stall_seconds,
                ", ".join(short),
                self.watchdog.failure_threshold,
            )
        for spec in self.registry.models:
            budget = RestartBudget(
                self.watchdog.max_restarts,
                self.watchdog.restart_window_seconds,
                self.watchdog.restart_cooldown_seconds,
            )
            backend = Backend(spec=spec, budget=budget)
            self.backends.append(backend)
            if not spec.entry.enabled:
                backend.state = State.DISABLED
                continue
            if not self.launch(backend):
                backend.launch_failed = True
                self.after_failed_launch(backend, backend.reason or "launch failed")
        self.publish()

    def after_failed_launch(self, backend: Backend, reason: str) -> None:
        if self.retryable(backend):
            backend.pending = reason
            self.set_state(backend, State.RESTARTING, reason)
        else:
            self.set_state(backend, State.FAILED, reason)

    # -- watching -------------------------------------------------------------------

    def check_starting(self, client: httpx.Client, backend: Backend) -> None:
        proc = backend.proc
        assert proc is not None
        assert backend.plan is not None
        if not proc.alive():
            self.on_exit(backend)
            return
        try:
            ok = client.get(backend.plan.health_url).status_code == 200
        except httpx.HTTPError:
            ok = False
        elapsed = self.clock() - proc.started_at
        if ok and proc.alive():
            self.set_state(backend, State.READY)
            log.info(
                "%s (%s) is ready on port %d after %.1fs",
                backend.role,
                backend.spec.entry.id,
                backend.spec.entry.port,
                elapsed,
            )
            if backend.attempt is not None:
                attempt, old_pid, reason = backend.attempt
                backend.attempt = None
                self.events.emit(
                    "restart_succeeded",
                    **backend.ids(),
                    reason=reason,
                    old_pid=old_pid,
                    new_pid=proc.pid,
                    attempt=attempt,
                    seconds=round(elapsed, 3),
                )
            return
        if elapsed > self.settings.ready_timeout_seconds and not backend.loading_reported:
            backend.loading_reported = True
            log.warning(
                "%s (%s) is still loading after %.0fs (see %s)",
                backend.role,
                backend.spec.entry.id,
                elapsed,
                backend.plan.log_path,
            )

    def on_exit(self, backend: Backend) -> None:
        """The backend's process ended by itself."""
        proc = backend.proc
        assert proc is not None
        description = process.describe_exit(proc.exit_status)
        backend.last_exit = description
        exit_code = (
            proc.exit_status if proc.exit_status is not None and proc.exit_status >= 0 else None
        )
        signal_name = None
        if proc.exit_status is not None and proc.exit_status < 0:
            signal_name = description.removeprefix("killed by ")
        self.events.emit(
            "backend_exited",
            **backend.ids(),
            pid=proc.pid,
            exit_code=exit_code,
            signal=signal_name,
            state=backend.state.value,
        )
        tail = process.tail_lines(proc.plan.log_path, 8)
        log.error(
            "%s (%s) exited (%s); last lines of %s:\n%s",
            backend.role,
            backend.spec.entry.id,
            description,
            proc.plan.log_path,
            "\n".join(f"    {line}" for line in tail),
        )
        reason = "exited" if backend.attempt is None else "exited while starting"
        if backend.attempt is not None:
            attempt, _old, _why = backend.attempt
            backend.attempt = None
            self.events.emit(
                "restart_failed",
                **backend.ids(),
                reason=f"{description} while starting",
                attempt=attempt,
            )
        if not self.watchdog.enabled:
            self.set_state(backend, State.FAILED, description)
            return
        self.request_restart(backend, reason)

    def request_restart(self, backend: Backend, reason: str) -> None:
        backend.pending = reason
        self.set_state(backend, State.RESTARTING, reason)
        self.try_restart(backend)

    def try_restart(self, backend: Backend) -> None:
        """Restart a RESTARTING backend if the budget allows, abandon it if not."""
        now = self.clock()
        reason = backend.pending or "restart"
        if backend.budget.exhausted(now):
            self.abandon(
                backend,
                f"{backend.budget.used} restarts within "
                f"{self.watchdog.restart_window_seconds:g}s; last reason: {reason}",
            )
            return
        if backend.budget.cooling(now) and not backend.launch_failed:
            return
        attempt = backend.budget.spend(now)
        backend.restarts += 1
        backend.last_restart_reason = reason
        kind = reason if reason in RESTART_REASONS else "launch_failed"
        backend.restarts_by_reason[kind] = backend.restarts_by_reason.get(kind, 0) + 1
        old = backend.proc
        old_pid = old.pid if old is not None else None
        self.events.emit(
            "restart_started", **backend.ids(), reason=reason, old_pid=old_pid, attempt=attempt
        )
        if old is not None and old.alive():
            if reason in WEDGED_REASONS:
                process.kill(old)
            else:
                process.stop(old, self.settings.stop_timeout_seconds)
        backend.launch_failed = not self.launch(backend)
        if not backend.launch_failed:
            backend.pending = None
            backend.attempt = (attempt, old_pid, reason)
            self.set_state(backend, State.STARTING, reason)
            return
        self.events.emit("restart_failed", **backend.ids(), reason=backend.reason, attempt=attempt)
        if not self.retryable(backend):
            self.set_state(backend, State.FAILED, backend.reason)
        elif backend.budget.exhausted(self.clock()):
            self.abandon(
                backend,
                f"{backend.budget.used} restarts within "
                f"{self.watchdog.restart_window_seconds:g}s; last reason: {backend.reason}",
            )

    def abandon(self, backend: Backend, reason: str) -> None:
        if backend.proc is not None and backend.proc.alive():
            process.stop(backend.proc, self.settings.stop_timeout_seconds)
        self.set_state(backend, State.ABANDONED, reason)
        self.events.emit("backend_abandoned", **backend.ids(), reason=reason)

    def handle_request(self, request: RestartRequest | str) -> None:
        """Act on one restart request from the router, or discard it as stale."""
        if isinstance(request, str):
            self.events.emit("stale_request_discarded", file=request, reason="unreadable request")
            return
        backend = next(
            (
                b
                for b in self.backends
                if b.role == request.role and b.spec.entry.port == request.port
            ),
            None,
        )
        fields = {"role": request.role, "model_id": request.model_id, "port": request.port}
        if backend is None:
            self.events.emit(
                "stale_request_discarded",
                **fields,
                reason="no such backend in this registry",
                requested_reason=request.reason,
            )
            return
        if backend.state not in RUNNING or backend.proc is None:
            self.events.emit(
                "backend_not_running",
                **fields,
                state=backend.state.value,
                requested_reason=request.reason,
            )
            return
        started = backend.started_wall or 0.0
        grace = self.watchdog.startup_grace_seconds
        if backend.state is State.RESTARTING or is_stale(request, started, grace):
            self.events.emit(
                "stale_request_discarded",
                **fields,
                requested_reason=request.reason,
                requested_at=request.requested_at,
                started_at=started,
                grace_seconds=grace,
                state=backend.state.value,
            )
            return
        self.request_restart(backend, request.reason)

    def sweep(self) -> None:
        """Take the router's requests and trim oversized backend logs."""
        for request in take_requests(self.watchdog.request_dir):
            self.handle_request(request)
        max_bytes = int(self.watchdog.backend_log_max_mb * 1024 * 1024)
        trimmed = process.trim_log(self.watchdog.log_path, max_bytes)
        if trimmed is not None:
            self.events.emit("backend_log_trimmed", path=str(self.watchdog.log_path), bytes=trimmed)
        for backend in self.backends:
            if backend.plan is None or max_bytes <= 0:
                continue
            size = process.trim_log(backend.plan.log_path, max_bytes)
            if size is not None:
                self.events.emit(
                    "backend_log_trimmed",
                    **backend.ids(),
                    path=str(backend.plan.log_path),
                    bytes=size,
                )

    def tick(self, client: httpx.Client) -> None:
        for backend in self.backends:
            if backend.state is State.STARTING:
                self.check_starting(client, backend)
            elif backend.state is State.READY:
                assert backend.proc is not None
                if not backend.proc.alive():
                    self.on_exit(backend)
            elif backend.state is State.RESTARTING:
                self.try_restart(backend)

    def running(self) -> list[Backend]:
        return [b for b in self.backends if b.state in RUNNING]

    def watch(self) -> int:
        """Supervise until a stop signal (0) or until no backend is left (1)."""
        next_sweep = self.clock()
        with httpx.Client(
            timeout=self.settings.health_probe_timeout_seconds, trust_env=False
        ) as client:
            while not self.stopping.is_set():
                self.tick(client)
                if self.watchdog.enabled and self.clock() >= next_sweep:
                    self.sweep()
                    next_sweep = self.clock() + self.watchdog.sweep_seconds
                self.publish()
                if not self.running():
                    log.error("no backend is running: every one failed or was abandoned")
                    return 1
                self.stopping.wait(TICK_SECONDS)
        return 0

    def stop_all(self) -> None:
        for backend in self.backends:
            if backend.proc is not None and backend.proc.alive():
                status = process.stop(backend.proc, self.settings.stop_timeout_seconds)
                log.info(
                    "stopped %s (%s): %s",
                    backend.role,
                    backend.spec.entry.id,
                    process.describe_exit(status),
                )
            if backend.state in RUNNING:
                self.set_state(backend, State.STOPPED)
        self.publish()

    def run(self) -> int:
        """Start, watch, stop; the exit status of the ``backends`` command."""
        self.install_signal_handlers()
        self.sweep_leftovers()
        status = 1
        try:
            self.start()
            if not self.running():
                log.error("nothing could be started")
                return 1
            status = self.watch()
            return status
        finally:
            self.stop_all()
            self.events.emit("supervisor_stopped", pid=os.getpid(), exit_status=status)
