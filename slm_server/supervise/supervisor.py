"""The ``backends`` command: start one server process per enabled model, watch each
one, restart dead or wedged ones within a bounded budget, and stop them all on
SIGINT/SIGTERM. Every decision goes to the watchdog log.

The shell of :mod:`slm_server.supervise.decide`, on one asyncio loop: each turn it
*observes* (process exits, finished launches, probes, stops and confirmations, the
router's restart requests each sweep, the clock), lets :func:`decide` *decide*, and
*acts* through one :class:`~slm_server.supervise.control.ProcessControl`. Anything slow
(a launch that must free a port, a stop, a probe, a confirmation) runs as a task of its
own with a bound, so no backend's trouble delays another's exit detection: every
process is polled each ``TICK_SECONDS``. A backend is ready when its ``/health``
answers 200 *and* its process is alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from types import FrameType
from typing import Any

from slm_server.config import ModelSpec, RegistryFile
from slm_server.contracts import commands
from slm_server.contracts.events import EventLog
from slm_server.contracts.records import (
    BackendState,
    PidRecord,
    process_create_time,
    read_pidfile,
    write_pidfile,
    write_state,
)
from slm_server.contracts.restart_requests import RestartRequest, take_requests
from slm_server.contracts.states import SUPERVISED, State
from slm_server.launch import process
from slm_server.launch.footprint import NoEstimate, estimate_entry, footprint_key
from slm_server.launch.plan import LaunchPlan, PlanError, Toolchain, plan_launch
from slm_server.memory import measure
from slm_server.memory.store import FootprintKey, FootprintStore
from slm_server.settings import Settings
from slm_server.supervise import decide as core
from slm_server.supervise import launcher_lock
from slm_server.supervise.confirm import judge
from slm_server.supervise.control import Child, ProcessControl, RealControl
from slm_server.supervise.evidence import Target
from slm_server.supervise.phases import (
    Confirming,
    Ready,
    Starting,
)
from slm_server.supervise.remotes import Remotes
from slm_server.supervise.restart_budget import RestartBudget
from slm_server.supervise.strays import verifiably_ours

log = logging.getLogger("slm_server.supervisor")

TICK_SECONDS = 0.2
# While a backend starts or loads, /health is probed this often (the router learns
# that a model it waits for is ready within this, plus its own look at the state file).
STARTING_PROBE_SECONDS = 0.05
# A ready backend's footprint is measured again each sweep and kept when it grew by more.
REMEASURE_GROWTH = 1.05
# How long to wait for a process to end after SIGKILL before reporting it and moving on.
KILL_WAIT_SECONDS = 5.0
_REAP_INTERVAL = 0.05


class Backend:
    """One registry entry: its lifecycle (decided), its plan and process (acted on)."""

    def __init__(self, spec: ModelSpec, life: core.Lifecycle) -> None:
        self.spec = spec
        self.life = life
        self.plan: LaunchPlan | None = None
        self.child: Child | None = None
        self.estimate_mb: int | None = None  # the footprint expected before a load
        self.footprint_key: FootprintKey | None = None  # where its measurement is kept

    @property
    def footprint_mb(self) -> int | None:
        """What the router admits this backend by: the registry's ``memory_mb``, else
        the footprint measured at its last load, else the estimate. Where resident
        memory misses GPU memory (macOS: Metal's wired memory), the larger of the
        measured and the estimate."""
        entry = self.spec.entry
        measured, estimate = self.life.measured_mb, self.estimate_mb
        if entry.memory_mb is not None:
            return entry.memory_mb
        if measured is None or estimate is None:
            return measured if measured is not None else estimate
        return measured if measure.RSS_COUNTS_GPU_MEMORY else max(measured, estimate)

    @property
    def role(self) -> str:
        return self.spec.role

    def snapshot(self, log_dir_path: str, now: float, wall: float) -> BackendState:
        """What the state file publishes for this backend (``now`` monotonic and
        ``wall`` clock of the same moment, to show when the budget frees up)."""
        life, child = self.life, self.child
        alive = child is not None and life.alive
        budget = life.budget
        return BackendState(
            role=self.spec.role,
            model_id=self.spec.entry.id,
            backend=self.spec.entry.backend,
            port=self.spec.entry.port,
            state=life.state.value,
            pid=child.pid if alive and child is not None else None,
            since=life.since,
            started_at=life.started_wall if alive else None,
            exit_status=child.exit_status if child is not None else None,
            restarts=life.restarts,
            reason=life.reason,
            log_path=str(self.plan.log_path) if self.plan is not None else log_dir_path,
            last_exit=life.last_exit,
            last_restart_reason=life.last_restart_reason,
            restarts_by_reason=dict(life.restarts_by_reason),
            kind=self.plan.kind if self.plan is not None else None,
            health_path=self.plan.health_path if self.plan is not None else "/health",
            request_defaults=dict(self.plan.request_defaults) if self.plan is not None else {},
            budget_max=budget.max_restarts,
            budget_window_seconds=budget.window,
            budget_spent_at=[round(wall - (now - t), 3) for t in budget.spent_at(now)],
            load=self.spec.entry.load,
            memory_estimate_mb=self.estimate_mb,
            memory_measured_mb=life.measured_mb,
            footprint_mb=self.footprint_mb,
            loaded_at=life.loaded_wall if life.state is State.READY else None,
        )


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
        control: ProcessControl | None = None,
        tools: Toolchain | None = None,
    ) -> None:
        self.settings = settings
        self.watchdog = settings.watchdog
        self.registry = registry
        self.env = env
        self.events = events or EventLog(settings.watchdog.log_path)
        self.clock = clock
        self.wall = wall
        self.control: ProcessControl = control or RealControl(
            env, settings.connect_timeout_seconds, clock
        )
        self.tools = tools or Toolchain.discover(settings.llama_server_bin)
        self.policy = core.Policy(
            watchdog_enabled=self.watchdog.enabled,
            restart_window_seconds=self.watchdog.restart_window_seconds,
            startup_grace_seconds=self.watchdog.startup_grace_seconds,
            ready_timeout_seconds=settings.ready_timeout_seconds,
            confirm=self.watchdog.confirm_seconds > 0,
            probe_interval_seconds=STARTING_PROBE_SECONDS,
            remeasure_growth=REMEASURE_GROWTH,
        )
        self.stopping = threading.Event()
        self.backends: dict[str, Backend] = {}
        self.previous_records: list[PidRecord] = []
        self.dirty = True
        self.inbox: list[core.Observation] = []
        self.tasks: set[asyncio.Task[None]] = set()
        self._wake: asyncio.Event | None = None
        self.create_time = process_create_time(os.getpid())
        self.chore_errors: dict[str, str] = {}  # path -> the last error reported for it
        self.footprints = FootprintStore(settings.footprints_path)
        remotes = [s for s in registry.enabled if s.entry.remote]
        self.remotes = Remotes(
            remotes, self.watchdog, self.control, self.events, clock, wall, self.spawn_task
        )

    # -- signals and records --------------------------------------------------------

    def request_stop(self, signum: int, _frame: FrameType | None = None) -> None:
        log.info("received %s: stopping backends", signal.Signals(signum).name)
        self.stopping.set()  # the loop sees it within a tick

    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self.request_stop)

    def sweep_leftovers(self) -> None:
        """Stop processes an earlier launcher started and could not stop (it was
        SIGKILLed where there is no parent-death signal): only those whose pid *and*
        create time still match the pidfile."""
        self.previous_records = read_pidfile(self.settings.pidfile_path)
        for record in self.previous_records:
            timeout = self.settings.stop_timeout_seconds
            if self.control.stop_leftover(record.pid, record.create_time, timeout):
                log.warning(
                    "stopped leftover backend %s (pid %d, port %d) from a previous run",
                    record.model_id,
                    record.pid,
                    record.port,
                )

    def housekeeping_failed(self, event: str, key: str, error: OSError, **fields: Any) -> None:
        """Report a failed file chore once per distinct error (a full disk would
        otherwise repeat it every sweep); supervision goes on."""
        message = f"{type(error).__name__}: {error}"
        if self.chore_errors.get(key) == message:
            return
        self.chore_errors[key] = message
        self.events.emit(event, **fields, path=key, error=message)

    def chore_done(self, key: str) -> None:
        self.chore_errors.pop(key, None)

    def publish(self) -> None:
        """Write the state file and pidfile when anything changed; a failed write is
        reported and retried on the next turn."""
        if not self.dirty:
            return
        pid = os.getpid()
        log_dir = str(self.settings.log_dir)
        backends = list(self.backends.values())
        now, wall = self.clock(), self.wall()
        snapshots = [b.snapshot(log_dir, now, wall) for b in backends]
        snapshots += self.remotes.snapshots(now, wall)
        self.remotes.dirty = False
        records = [
            PidRecord(
                pid=b.child.pid,
                create_time=b.child.create_time,
                port=b.spec.entry.port,
                role=b.role,
                model_id=b.spec.entry.id,
                argv=list(b.plan.argv),
            )
            for b in backends
            if b.child is not None and b.plan is not None and b.child.poll() is None
        ]
        writes: list[tuple[Path, Callable[[Path], None]]] = [
            (self.settings.state_path, lambda p: write_state(p, pid, snapshots, self.create_time)),
            (self.settings.pidfile_path, lambda p: write_pidfile(p, pid, records)),
        ]
        written = True
        for path, write in writes:
            try:
                write(path)
            except OSError as exc:
                written = False
                self.housekeeping_failed("state_write_failed", str(path), exc)
            else:
                self.chore_done(str(path))
        self.dirty = not written

    # -- observe -> decide -> act ---------------------------------------------------

    def lives(self) -> dict[str, core.Lifecycle]:
        return {role: b.life for role, b in self.backends.items()}

    def apply(self, observation: core.Observation) -> list[core.Action]:
        """Decide on one observation and carry out what it calls for; the actions (an
        :class:`~slm_server.supervise.decide.Answer` among them goes to the caller).

        A change of state is published before the events that report it, so whoever
        reads an event in ``watchdog.jsonl`` finds the state file already agreeing."""
        before = {role: (b.life.state, b.life.reason) for role, b in self.backends.items()}
        actions = core.decide(self.lives(), observation, self.clock(), self.wall(), self.policy)
        after = {role: (b.life.state, b.life.reason) for role, b in self.backends.items()}
        if before != after:
            self.dirty = True
            self.publish()
        for action in actions:
            self.act(action)
        return actions

    def act(self, action: core.Action) -> None:
        if isinstance(action, core.Emit):
            self.events.emit(action.event, **action.fields)
        elif isinstance(action, core.Log):
            log.log(action.level, "%s", action.message)
        elif isinstance(action, core.Launch):
            self.spawn_task(self.launch(self.backends[action.role]))
        elif isinstance(action, core.Stop):
            backend = self.backends[action.role]
            if backend.child is not None and backend.child.pid == action.pid:
                self.spawn_task(self.stop_task(backend, backend.child, action.kill))
        elif isinstance(action, core.Probe):
            self.spawn_task(self.probe(self.backends[action.role]))
        elif isinstance(action, core.Remember):
            self.remember_footprint(self.backends[action.role], action.resident_mb)
            self.dirty = True
        elif isinstance(action, core.Confirm):
            self.spawn_task(self.confirm(self.backends[action.role], action.reason))

    def spawn_task(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("supervisor task failed", exc_info=task.exception())
        if self._wake is not None:
            self._wake.set()

    def observe_exits(self) -> list[core.Observation]:
        """Poll every live process of a backend that is starting or serving."""
        exits: list[core.Observation] = []
        for backend in self.backends.values():
            life, child = backend.life, backend.child
            if child is None or not life.alive:
                continue
            if not isinstance(life.phase, Starting | Ready | Confirming):
                continue
            status = child.poll()
            if status is None:
                continue
            path = backend.plan.log_path if backend.plan is not None else None
            exits.append(
                core.Exited(
                    role=backend.role,
                    pid=child.pid,
                    status=status,
                    description=process.describe_exit(status),
                    tail=tuple(self.control.tail(path, 8)) if path is not None else (),
                    log_path=str(path) if path is not None else "",
                )
            )
        return exits

    # -- acting: each a task of its own, reporting back through the inbox ------------

    def report(self, observation: core.Observation) -> None:
        self.inbox.append(observation)

    def is_ours(self, holder: process.PortHolder, plan: LaunchPlan) -> bool:
        """Whether the process holding the port is one this supervisor (or the one
        before it) started."""
        known = [(r.pid, r.create_time) for r in self.previous_records]
        known += [
            (b.child.pid, b.child.create_time)
            for b in self.backends.values()
            if b.child is not None
        ]
        return verifiably_ours(holder.pid, holder.create_time, holder.argv, known, plan.argv)

    async def free_port(self, backend: Backend, plan: LaunchPlan) -> str | None:
        """Make sure the backend's port is free (killing a holder only if it is ours);
        why not when it is not."""
        holder = self.control.port_holder(plan.host, plan.port)
        if holder is None:
            return None
        ids = backend.life.ids()
        if not self.is_ours(holder, plan):
            self.events.emit(
                "stray_kill_refused",
                **ids,
                pid=holder.pid,
                command=holder.command,
                reason="the process holding the port is not one slm_server started",
            )
            return f"port {plan.port} is in use by {holder}"
        assert holder.pid is not None
        timeout = self.settings.stop_timeout_seconds
        await asyncio.to_thread(self.control.kill_stray, holder.pid, holder.create_time, timeout)
        freed = await asyncio.to_thread(
            self.control.port_free_within, plan.host, plan.port, timeout
        )
        self.events.emit(
            "port_stray_killed", **ids, pid=holder.pid, command=holder.command, freed=freed
        )
        return None if freed else f"port {plan.port} is still in use by {holder}"

    async def launch(self, backend: Backend) -> None:
        """Plan and spawn the backend; reports :class:`Launched`."""
        spec = backend.spec
        try:
            plan = plan_launch(spec, self.tools, self.settings.log_dir, str(self.registry.path))
        except PlanError as exc:
            reason = "; ".join(p.message for p in exc.problems)
            if exc.missing:
                problem = exc.problems[0]
                self.events.emit(
                    "model_path_missing",
                    **backend.life.ids(),
                    field=problem.field,
                    reason=problem.message,
                )
            else:
                for problem in exc.problems:
                    log.error("not starting: %s", problem)
            self.report(core.Launched(backend.role, None, reason, retryable=exc.missing))
            return
        backend.plan = plan
        refused = await self.free_port(backend, plan)
        if refused is not None:
            log.error("%s (%s): %s", spec.role, spec.entry.id, refused)
            self.report(core.Launched(backend.role, None, refused, retryable=True))
            return
        if self.stopping.is_set():
            self.report(core.Launched(backend.role, None, "shutting down", retryable=False))
            return
        try:
            child = self.control.spawn(plan)
        except OSError as exc:  # the log could not be opened, the binary not executed
            log.error("%s (%s): cannot start: %s", spec.role, spec.entry.id, exc)
            self.report(core.Launched(backend.role, None, f"cannot start: {exc}"))
            return
        backend.child = child
        log.info(
            "starting %s (%s) on %s:%d, pid %d, log %s",
            spec.role,
            spec.entry.id,
            plan.host,
            plan.port,
            child.pid,
            plan.log_path,
        )
        self.report(core.Launched(backend.role, child.pid))

    async def reap(self, child: Child, timeout: float) -> int | None:
        """Wait (polling, never blocking the loop) up to ``timeout`` for ``child`` to end."""
        deadline = self.clock() + timeout
        while (status := child.poll()) is None and self.clock() < deadline:
            await asyncio.sleep(_REAP_INTERVAL)
        return status

    async def stop_child(self, child: Child, kill: bool) -> tuple[int | None, bool]:
        """SIGTERM the child's group and SIGKILL it after the stop timeout (or at once
        when ``kill``); the exit status and whether it survived even SIGKILL."""
        status = child.poll()
        if status is None and not kill:
            self.control.signal_group(child.pid, signal.SIGCONT)
            self.control.signal_group(child.pid, signal.SIGTERM)
            status = await self.reap(child, self.settings.stop_timeout_seconds)
        if status is None:
            self.control.signal_group(child.pid, signal.SIGKILL)
            status = await self.reap(child, KILL_WAIT_SECONDS)
        # Anything the backend forked shares its group; make sure none outlives it.
        self.control.signal_group(child.pid, signal.SIGKILL)
        return status, status is None

    async def stop_task(self, backend: Backend, child: Child, kill: bool) -> None:
        status, survived = await self.stop_child(child, kill)
        self.report(core.Stopped(backend.role, child.pid, status, survived))

    def estimate(self, spec: ModelSpec) -> tuple[FootprintKey | None, int | None, int | None]:
        """Where the entry's footprint is kept, its expected footprint, and the one
        measured at an earlier load of the same files and settings (remembered across
        runs)."""
        entry = spec.entry
        key = footprint_key(entry)
        remembered = self.footprints.get(key) if key is not None else None
        estimate = None
        try:
            estimate = estimate_entry(entry).mb
        except NoEstimate as exc:
            log.info("no memory estimate for %s (%s): %s", spec.role, entry.id, exc)
        return key, estimate, remembered

    def remeasure(self) -> None:
        """Serving grows a backend (buffers on its first requests, the prompt cache):
        each ready one is measured again, and :func:`decide` keeps what grew enough."""
        for backend in self.backends.values():
            life, child = backend.life, backend.child
            if life.state is not State.READY or child is None or not life.alive:
                continue
            resident = self.control.resident_mb(child.pid)
            if resident is not None:
                self.apply(core.Measured(backend.role, resident))

    def remember_footprint(self, backend: Backend, resident_mb: int) -> None:
        key = backend.footprint_key
        if key is None or self.footprints.get(key) == resident_mb:
            return
        if self.footprints.put(key, resident_mb):
            self.chore_done(str(self.footprints.path))
        else:
            error = OSError(self.footprints.last_error or "cannot write")
            self.housekeeping_failed("state_write_failed", str(self.footprints.path), error)

    async def probe(self, backend: Backend) -> None:
        """Probe ``/health``; reports :class:`HealthProbed`, or :class:`ProbeLost` when
        the probe itself failed (so that another may go out)."""
        answered = False
        try:
            if backend.plan is None:
                return
            timeout = self.settings.health_probe_timeout_seconds
            ok = await self.control.probe(backend.plan.base_url, backend.plan.health_path, timeout)
            child = backend.child
            resident = self.control.resident_mb(child.pid) if ok and child is not None else None
            self.report(core.HealthProbed(backend.role, ok, resident))
            answered = True
        finally:
            if not answered:
                self.report(core.ProbeLost(backend.role))

    async def confirm(self, backend: Backend, reason: str) -> None:
        """Gather the evidence on a trip and judge it; reports :class:`Judged`."""
        child, plan, spec = backend.child, backend.plan, backend.spec
        if child is None or plan is None:
            return
        llama = self.tools.llama
        target = Target(
            pid=child.pid,
            create_time=child.create_time,
            model_id=spec.entry.id,
            model_type=spec.entry.model_type,
            # Only the native llama-server has /slots.
            has_slots=spec.entry.backend == "llamacpp" and llama is not None and llama.is_native,
            health_path=plan.health_path,
        )
        budget = self.watchdog.confirm_seconds
        try:
            evidence = await self.control.gather_evidence(plan.base_url, target, budget)
        except Exception as exc:
            # A bug here must neither stop supervision nor restart a backend that may
            # well be healthy: the trip is not confirmed.
            log.exception("confirmation of %s failed", spec.entry.id)
            self.report(core.Judged(backend.role, False, "confirmation_failed", str(exc)))
            return
        decision = judge(evidence)
        self.report(
            core.Judged(
                backend.role,
                decision.restart,
                decision.rule,
                decision.reason,
                evidence.to_fields(),
            )
        )

    # -- the loop -----------------------------------------------------------------------

    def start(self) -> None:
        """Start every enabled entry; record disabled ones."""
        self.events.emit(
            "supervisor_started",
            pid=os.getpid(),
            config=str(self.registry.path),
            models=list(dict.fromkeys(m.entry.id for m in self.registry.enabled)),
            **self.watchdog.tunables(),
            stop_timeout_seconds=self.settings.stop_timeout_seconds,
            ready_timeout_seconds=self.settings.ready_timeout_seconds,
            memory_budget_mb=self.settings.memory.budget_mb,
            max_loaded=self.settings.memory.max_loaded,
            swap_hold_seconds=self.settings.memory.hold_seconds,
            swap_aging_seconds=self.settings.memory.aging_seconds,
            on_demand=[m.entry.id for m in self.registry.enabled if m.entry.load == "on_demand"]
            or None,
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
            if spec.role in self.remotes:
                continue  # nothing to start: see Remotes
            budget = RestartBudget(
                self.watchdog.max_restarts,
                self.watchdog.restart_window_seconds,
                self.watchdog.restart_cooldown_seconds,
            )
            entry = spec.entry
            key, estimate, remembered = self.estimate(spec) if entry.enabled else (None,) * 3
            life = core.Lifecycle(
                role=spec.role,
                model_id=entry.id,
                port=entry.port,
                budget=budget,
                measured_mb=remembered,
                enabled=entry.enabled,
                on_demand=entry.load == "on_demand",
            )
            backend = Backend(spec, life)
            backend.footprint_key, backend.estimate_mb = key, estimate
            self.backends[spec.role] = backend
        self.apply(core.Begin())  # the first phases, and the first launches

    def sweep(self) -> None:
        """Take the router's requests and trim oversized logs. A failing chore is
        reported (``request_sweep_failed``, ``backend_log_trim_failed``) and skipped."""
        directory = self.watchdog.request_dir
        try:
            requests = take_requests(directory)
        except OSError as exc:
            self.housekeeping_failed("request_sweep_failed", str(directory), exc)
            requests = []
        else:
            self.chore_done(str(directory))
        for request in requests:
            if isinstance(request, RestartRequest) and request.role in self.remotes:
                self.remotes.trip(request)  # ejected, never restarted
            else:
                self.apply(core.Requested(request))
        self.remeasure()
        max_bytes = int(self.watchdog.backend_log_max_mb * 1024 * 1024)
        if max_bytes <= 0:
            return
        self.trim(self.watchdog.log_path, max_bytes, {})
        for backend in self.backends.values():
            if backend.plan is not None:
                self.trim(backend.plan.log_path, max_bytes, backend.life.ids())

    def trim(self, path: Path, max_bytes: int, ids: Mapping[str, object]) -> None:
        try:
            size = self.control.trim_log(path, max_bytes)
        except OSError as exc:
            self.housekeeping_failed("backend_log_trim_failed", str(path), exc, **ids)
            return
        self.chore_done(str(path))
        if size is not None:
            self.events.emit("backend_log_trimmed", **ids, path=str(path), bytes=size)

    def running(self) -> bool:
        """Whether any backend is starting, serving, restarting, or unloaded (an
        on-demand model waiting for its first request is no failure)."""
        if self.remotes.by_role:
            return True  # a remote is served whatever becomes of the local backends
        return any(b.life.state in SUPERVISED for b in self.backends.values())

    def turn(self) -> None:
        """One turn of the loop: exits first, then what the tasks reported, then time."""
        for observation in self.observe_exits():
            self.apply(observation)
        while self.inbox:
            self.apply(self.inbox.pop(0))
        self.apply(core.Tick())
        self.remotes.tick()
        self.dirty = self.dirty or self.remotes.dirty

    async def watch(self) -> int:
        """Supervise until a stop signal (0) or until no backend is left (1)."""
        self._wake = asyncio.Event()
        next_sweep = self.clock()
        self.start()
        self.publish()
        while not self.stopping.is_set():
            self.turn()
            if self.watchdog.enabled and self.clock() >= next_sweep:
                self.sweep()
                next_sweep = self.clock() + self.watchdog.sweep_seconds
            self.publish()
            if not self.running():
                log.error("no backend is running: every one failed or was abandoned")
                return 1
            self._wake.clear()
            starting = any(isinstance(b.life.phase, Starting) for b in self.backends.values())
            wait = STARTING_PROBE_SECONDS if starting else TICK_SECONDS
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait)
        return 0

    async def stop_all(self) -> None:
        """Stop every backend, all at once."""
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

        async def stop(backend: Backend, child: Child) -> None:
            status, survived = await self.stop_child(child, kill=False)
            if survived:
                self.events.emit(
                    "process_unkillable",
                    **backend.life.ids(),
                    pid=child.pid,
                    reason="still alive after SIGKILL at shutdown; left, not waited on",
                )
            log.info(
                "stopped %s (%s): %s",
                backend.role,
                backend.spec.entry.id,
                process.describe_exit(status),
            )

        await asyncio.gather(
            *(
                stop(b, b.child)
                for b in self.backends.values()
                if b.child is not None and b.child.poll() is None
            )
        )
        self.remotes.stop()
        self.dirty = True
        self.apply(core.Shutdown())  # every supervised backend STOPPED, and published
        self.publish()

    def command(self, command: commands.Command) -> commands.Reply:
        """The router's load or unload, decided at once (and published, so the router
        sees ``loading`` or ``unloading`` without waiting for the next turn)."""
        observation: core.LoadRequested | core.UnloadRequested
        if command.op == "load":
            observation = core.LoadRequested(command.role)
        else:
            reason = command.reason or "api"
            observation = core.UnloadRequested(command.role, reason, command.for_model)
        actions = self.apply(observation)
        [answer] = [a for a in actions if isinstance(a, core.Answer)]
        self.publish()
        if self._wake is not None:
            self._wake.set()
        return commands.Reply(answer.accepted, answer.state, answer.error)

    async def main(self) -> int:
        status = 1
        path = commands.socket_path(self.settings.log_dir)
        server = None
        try:
            try:
                server = await commands.serve(path, self.command)
            except OSError as exc:
                log.error("cannot listen for the router's commands on %s: %s", path, exc)
            status = await self.watch()
            return status
        finally:
            if server is not None:
                server.close()
                with contextlib.suppress(OSError):
                    path.unlink()
            await self.stop_all()
            await self.control.aclose()
            self.events.emit("supervisor_stopped", pid=os.getpid(), exit_status=status)

    def run(self) -> int:
        """Start, watch, stop; the exit status of the ``backends`` command (1 at once,
        touching nothing, when another launcher supervises the same log directory)."""
        lock = self.take_lock()
        if lock is None:
            return 1
        try:
            self.install_signal_handlers()
            self.sweep_leftovers()
            return asyncio.run(self.main())
        finally:
            lock.release()

    def take_lock(self) -> launcher_lock.LauncherLock | None:
        """This log directory's launcher lock (:mod:`.launcher_lock`); None when another
        launcher holds it (reported). A file that cannot be had at all (a read-only
        directory) is reported, and supervision goes on without the lock."""
        log_dir = self.settings.log_dir
        try:
            taken = launcher_lock.take(log_dir)
        except OSError as exc:
            log.warning("cannot take the launcher lock in %s: %s", log_dir, exc)
            return launcher_lock.LauncherLock(log_dir / launcher_lock.LOCK_NAME, None)
        if isinstance(taken, launcher_lock.Held):
            holder = f"pid {taken.holder}" if taken.holder is not None else "another process"
            log.error(
                "another launcher (%s) already supervises %s; stop it first, or give this "
                "one its own SLM_BACKEND_LOG_DIR",
                holder,
                log_dir,
            )
            self.events.emit(
                "supervisor_refused", pid=os.getpid(), holder_pid=taken.holder, path=taken.path
            )
            return None
        return taken
