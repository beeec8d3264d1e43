"""The ``backends`` command: start one server process per enabled model, watch each
one, restart dead or wedged ones within a bounded budget, and stop them all on
SIGINT/SIGTERM. Every decision goes to the watchdog log.

The shell of :mod:`slm_server.supervise.core.decide`, on one asyncio loop: each turn it
*observes* (process exits, finished launches, probes, stops and confirmations, the
router's restart requests each sweep, the clock), lets :func:`decide` *decide*, and
*acts* through one :class:`~slm_server.supervise.control.ProcessControl`. Anything slow
(a launch that must free a port, a stop, a probe, a confirmation) runs as a task of its
own with a bound, so no backend's trouble delays another's exit detection: every
process is polled each ``TICK_SECONDS``. A backend is ready when its ``/health``
answers 200 *and* its process is alive.

Only :func:`decide` writes a backend's lifecycle (its first phase, shutdown and the
router's commands included). The chores live beside this loop, each on the same
process control: :mod:`.publish` (the state file and pidfile), :mod:`.footprints`
(estimates, measurements, the store), :mod:`.housekeeping` (leftovers, request files,
log trimming, failed chores reported once) and :mod:`.command_socket` (the router's
load and unload). This module keeps the loop, launching, stopping, probing,
confirming, and the wiring.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable, Coroutine, Mapping
from types import FrameType
from typing import Any

from slm_server.contracts import applied_registry, commands
from slm_server.contracts.applied_registry import RegistryStamp, RetireReason
from slm_server.contracts.events import EventLog
from slm_server.contracts.records import (
    PidRecord,
)
from slm_server.contracts.restart_requests import RestartRequest
from slm_server.contracts.states import SUPERVISED
from slm_server.launch import process
from slm_server.launch.plan import LaunchPlan, PlanError, Toolchain, plan_launch
from slm_server.registry.schema import ModelSpec, RegistryFile
from slm_server.settings import Settings
from slm_server.slotcache.store import SlotStore
from slm_server.supervise import command_socket, launcher_lock
from slm_server.supervise.backend import Backend, admitted_mb
from slm_server.supervise.command_socket import CommandSocket
from slm_server.supervise.control import Child, ProcessControl, RealControl
from slm_server.supervise.core import decide as core
from slm_server.supervise.core.actions import (
    Action,
    Confirm,
    Emit,
    Launch,
    Log,
    Probe,
    Remember,
    Stop,
)
from slm_server.supervise.core.confirm import judge
from slm_server.supervise.core.observations import (
    Begin,
    HealthProbed,
    Judged,
    Launched,
    Observation,
    ProbeLost,
    Released,
    Requested,
    Shutdown,
    Stopped,
    Tick,
)
from slm_server.supervise.core.phases import (
    Held,
    Ready,
    Starting,
)
from slm_server.supervise.core.registry_diff import LaunchKey
from slm_server.supervise.core.restart_budget import RestartBudget
from slm_server.supervise.core.strays import verifiably_ours
from slm_server.supervise.evidence import Target
from slm_server.supervise.footprints import Expected, Footprints
from slm_server.supervise.housekeeping import ChoreErrors, Housekeeping
from slm_server.supervise.publish import Publisher
from slm_server.supervise.reload.prepare import Prepared, Refusal, conflicts, plan_all, prepare
from slm_server.supervise.reload.retire import Retiree, Retirements
from slm_server.supervise.reload.watch import ConfigWatch
from slm_server.supervise.remotes import Remotes
from slm_server.supervise.signal_flag import SignalFlag
from slm_server.supervise.slot_saves import SlotSaves

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


def policy_of(settings: Settings) -> core.Policy:
    """The tunables :func:`decide` reads, from the settings."""
    watchdog = settings.watchdog
    return core.Policy(
        watchdog_enabled=watchdog.enabled,
        restart_window_seconds=watchdog.restart_window_seconds,
        startup_grace_seconds=watchdog.startup_grace_seconds,
        ready_timeout_seconds=settings.ready_timeout_seconds,
        confirm=watchdog.confirm_seconds > 0,
        probe_interval_seconds=STARTING_PROBE_SECONDS,
        remeasure_growth=REMEASURE_GROWTH,
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
        registry_text: str | None = None,
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
        self.policy = policy_of(settings)
        self.stopping = SignalFlag()  # SIGINT/SIGTERM: stop within a tick
        self.backends: dict[str, Backend] = {}
        self.previous_records: list[PidRecord] = []
        self.inbox: list[Observation] = []
        self.tasks: set[asyncio.Task[None]] = set()
        self._wake: asyncio.Event | None = None
        chores = ChoreErrors(self.events)
        self.publisher = Publisher(settings, chores, clock, wall)
        self.footprints = Footprints(
            settings.footprints_path,
            self.control,
            chores,
            native=self.tools.llama is not None and self.tools.llama.is_native,
            budget_mb=settings.memory.budget_mb,
        )
        self.housekeeping = Housekeeping(settings, self.control, self.events, chores)
        slots = settings.slot_cache
        store = SlotStore(slots.directory, slots.budget_mb)
        self.slot_saves = SlotSaves(store, self.control, self.events, slots.timeout_seconds)
        self.slot_dir = self.slot_saves.prepare_directory() if slots.enabled else None
        self.commands = CommandSocket(settings.log_dir)
        remotes = [s for s in registry.enabled if s.entry.remote]
        self.remotes = Remotes(
            remotes, self.watchdog, self.control, self.events, clock, wall, self.spawn_task
        )
        # The registry in force (see contracts/applied_registry.py): its text, stamp and
        # the launch key of each backend, which a reload compares.
        self.registry_text = registry_text
        self.stamp: RegistryStamp | None = None
        self.keys: dict[str, LaunchKey] = {}
        self.retirements = Retirements(settings.serving.drain_timeout_seconds, wall)
        self.reload_asked = SignalFlag()  # SIGHUP: reload within a tick
        self.watch_file: ConfigWatch | None = None

    # -- signals and records --------------------------------------------------------

    def request_stop(self, signum: int, _frame: FrameType | None = None) -> None:
        log.info("received %s: stopping backends", signal.Signals(signum).name)
        self.stopping.set()  # the loop sees it within a tick

    def request_reload(self, _signum: int, _frame: FrameType | None = None) -> None:
        log.info("received SIGHUP: reloading the registry")
        self.reload_asked.set()  # the loop reloads within a tick

    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self.request_stop)
        signal.signal(signal.SIGHUP, self.request_reload)

    def sweep_leftovers(self) -> None:
        self.previous_records = self.housekeeping.sweep_leftovers()

    @property
    def dirty(self) -> bool:
        """Whether the state file is behind (see :class:`.publish.Publisher`)."""
        return self.publisher.dirty

    @dirty.setter
    def dirty(self, value: bool) -> None:
        self.publisher.dirty = value

    def publish(self) -> None:
        """Write the state file and pidfile when anything changed."""
        retiring = [(r.backend, r.record) for r in self.retirements.by_pid.values()]
        self.publisher.publish(self.backends.values(), self.remotes, self.stamp, retiring)

    # -- observe -> decide -> act ---------------------------------------------------

    def lives(self) -> dict[str, core.Lifecycle]:
        return {role: b.life for role, b in self.backends.items()}

    def apply(self, observation: Observation) -> list[Action]:
        """Decide on one observation and carry out what it calls for; the actions (an
        :class:`~slm_server.supervise.core.decide.Answer` among them goes to the caller).

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

    def act(self, action: Action) -> None:
        if isinstance(action, Emit):
            self.events.emit(action.event, **action.fields)
        elif isinstance(action, Log):
            log.log(action.level, "%s", action.message)
        elif isinstance(action, Launch):
            self.spawn_task(self.launch(self.backends[action.role]))
        elif isinstance(action, Stop):
            backend = self.backends[action.role]
            if backend.child is not None and backend.child.pid == action.pid:
                self.spawn_task(self.stop_task(backend, backend.child, action.kill, action.save))
        elif isinstance(action, Probe):
            self.spawn_task(self.probe(self.backends[action.role]))
        elif isinstance(action, Remember):
            self.footprints.remember(self.backends[action.role], action.resident_mb)
            self.dirty = True
        elif isinstance(action, Confirm):
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

    def observe_exits(self) -> list[Observation]:
        """Poll every live process of a backend that is starting or serving."""
        found = (b.exited(self.control.tail) for b in self.backends.values())
        return [exit for exit in found if exit is not None]

    # -- acting: each a task of its own, reporting back through the inbox ------------

    def report(self, observation: Observation) -> None:
        self.inbox.append(observation)

    def current(self, backend: Backend) -> bool:
        """Whether ``backend`` is still the one of its role (a reload may have replaced
        or removed it while a task of its own ran)."""
        return self.backends.get(backend.role) is backend

    def is_ours(self, holder: process.PortHolder, plan: LaunchPlan) -> bool:
        """Whether the process holding the port is one this supervisor (or the one
        before it) started."""
        known = [(r.pid, r.create_time) for r in self.previous_records]
        known += [
            (b.child.pid, b.child.create_time)
            for b in [*self.backends.values(), *self.retirements.backends()]
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
            plan = plan_launch(
                spec,
                self.tools,
                self.settings.log_dir,
                str(self.registry.path),
                budget_mb=self.settings.memory.budget_mb,
                slot_dir=self.slot_dir,
            )
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
            self.report(Launched(backend.role, None, reason, retryable=exc.missing))
            return
        backend.plan = plan
        refused = await self.free_port(backend, plan)
        if refused is not None:
            log.error("%s (%s): %s", spec.role, spec.entry.id, refused)
            self.report(Launched(backend.role, None, refused, retryable=True))
            return
        if self.stopping.is_set():
            self.report(Launched(backend.role, None, "shutting down", retryable=False))
            return
        if not self.current(backend):
            return  # a reload replaced or removed it while its port was freed
        try:
            child = self.control.spawn(plan)
        except OSError as exc:  # the log could not be opened, the binary not executed
            log.error("%s (%s): cannot start: %s", spec.role, spec.entry.id, exc)
            self.report(Launched(backend.role, None, f"cannot start: {exc}"))
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
        self.report(Launched(backend.role, child.pid))

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

    async def stop_task(self, backend: Backend, child: Child, kill: bool, save: bool) -> None:
        if save and child.poll() is None:
            await self.slot_saves.save(backend)
            self.dirty = True
        status, survived = await self.stop_child(child, kill)
        self.report(Stopped(backend.role, child.pid, status, survived))

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
            if ok and child is not None and backend.restored_pid != child.pid:
                backend.restored_pid = child.pid  # once per process, before it is ready
                await self.slot_saves.restore(backend)
                self.dirty = True
            resident = self.control.resident_mb(child.pid) if ok and child is not None else None
            answered = True
            if self.current(backend):
                self.report(HealthProbed(backend.role, ok, resident))
        finally:
            if not answered and self.current(backend):
                self.report(ProbeLost(backend.role))

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
            self.report(Judged(backend.role, False, "confirmation_failed", str(exc)))
            return
        decision = judge(evidence)
        self.report(
            Judged(
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
        # Every entry planned once: the launch keys a reload compares against, and
        # whether each one's slots are kept (the launches plan again, as they must).
        plans, self.keys, _problems = plan_all(
            self.registry,
            self.tools,
            self.settings.log_dir,
            budget_mb=self.settings.memory.budget_mb,
            slot_dir=self.slot_dir,
        )
        for spec in self.registry.models:
            if spec.role in self.remotes:
                continue  # nothing to start: see Remotes
            self.backends[spec.role] = self.new_backend(spec, plans.get(spec.role))
        self.stamp_registry()
        self.apply(Begin())  # the first phases, and the first launches

    def new_backend(
        self,
        spec: ModelSpec,
        plan: LaunchPlan | None = None,
        reloaded: bool = False,
        held_by: int | None = None,
    ) -> Backend:
        """A backend for ``spec`` (planned as ``plan``; None: it cannot be) with a fresh
        restart budget, not yet begun."""
        budget = RestartBudget(
            self.watchdog.max_restarts,
            self.watchdog.restart_window_seconds,
            self.watchdog.restart_cooldown_seconds,
        )
        entry = spec.entry
        expected = self.footprints.expect(spec) if entry.enabled else Expected()
        life = core.Lifecycle(
            role=spec.role,
            model_id=entry.id,
            port=entry.port,
            budget=budget,
            measured_mb=expected.remembered_mb,
            enabled=entry.enabled,
            on_demand=entry.load == "on_demand",
            reloaded=reloaded and entry.enabled and entry.load == "always",
            held_by=held_by,
        )
        backend = Backend(spec, life)
        backend.footprint_key, backend.estimate_mb = expected.key, expected.estimate_mb
        backend.prompt_cache_mb = expected.prompt_cache_mb
        if plan is not None:
            self.expect_slots(backend, plan)
        return backend

    def expect_slots(self, backend: Backend, plan: LaunchPlan) -> None:
        """Whether its slots are kept across unloads, and what is saved for it."""
        backend.slot_skip = plan.slot_cache_skip
        slots = backend.spec.entry.max_concurrency
        backend.slot_tokens = self.slot_saves.saved_tokens(plan.slot_cache_key, slots)

    def stamp_registry(self) -> None:
        """Publish the registry at start: its snapshot, then (with the state file) its
        stamp."""
        text = self.registry_text
        if text is None:
            try:
                text = self.registry.path.read_text(encoding="utf-8")
            except OSError:
                text = None
        if text is not None:
            self.registry_text = text
            self.publish_registry(text, 1)
        if self.settings.config_watch:
            self.watch_file = ConfigWatch(
                self.registry.path, self.settings.config_watch_settle_seconds
            )

    def publish_registry(self, text: str, generation: int) -> bool:
        """Write the applied registry's snapshot now and its stamp with the next state
        file; False when the snapshot cannot be written (reported; the stamp then stays
        as it was)."""
        path = applied_registry.snapshot_path(self.settings.log_dir)
        try:
            applied_registry.write_snapshot(self.settings.log_dir, text)
        except OSError as exc:
            self.publisher.chores.failed("state_write_failed", str(path), exc)
            return False
        self.stamp = RegistryStamp(
            applied_registry.version_of(text),
            generation,
            round(self.wall(), 3),
            str(self.registry.path),
        )
        self.dirty = True
        return True

    def sweep(self) -> None:
        """Take the router's requests, measure the ready backends again and trim
        oversized logs. A failing chore is reported (``request_sweep_failed``,
        ``backend_log_trim_failed``) and skipped."""
        for request in self.housekeeping.take_requests():
            if isinstance(request, RestartRequest) and request.role in self.remotes:
                self.remotes.trip(request)  # ejected, never restarted
            else:
                self.apply(Requested(request))
        for measured in self.footprints.measure(self.backends.values()):
            life = self.backends[measured.role].life
            before = (life.resident_mb, life.measured_mb)
            self.apply(measured)
            if (life.resident_mb, life.measured_mb) != before:
                self.dirty = True
        self.housekeeping.trim_logs(self.backends.values())

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
        self.apply(Tick())
        self.remotes.tick()
        self.dirty = self.dirty or self.remotes.dirty
        for retiree, why in self.retirements.due():
            retiree.stopping = True
            self.spawn_task(self.retire(retiree, why))
        if self.reload_asked.is_set():
            self.reload_asked.clear()
            self.reload("signal")
        if self.watch_file is not None and self.watch_file.due(self.clock()):
            self.reload("file")

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

        # A graceful stop keeps the caches, within the stop timeout all together: a
        # backend wedged and not yet caught must not hold the shutdown up.
        saves_until = time.monotonic() + self.settings.stop_timeout_seconds

        async def stop(backend: Backend, child: Child) -> None:
            if isinstance(backend.life.phase, Ready):
                await self.slot_saves.save(backend, saves_until)
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

        retiring = [r.backend for r in self.retirements.by_pid.values()]
        await asyncio.gather(
            *(
                stop(b, b.child)
                for b in [*self.backends.values(), *retiring]
                if b.child is not None and b.child.poll() is None
            )
        )
        self.retirements.by_pid.clear()
        self.remotes.stop()
        self.dirty = True
        self.apply(Shutdown())  # every supervised backend STOPPED, and published
        self.publish()

    def command(self, command: commands.Command) -> commands.Reply:
        """A command on the socket, decided at once and published before the reply:
        the router's load or unload (so it sees ``loading`` or ``unloading`` without
        waiting for the next turn), a reload, a retiring backend drained."""
        if command.op == "reload":
            return self.reload("command")
        if command.op == "retired":
            taken = command.pid is not None and self.retirements.drained(command.role, command.pid)
            if self._wake is not None:
                self._wake.set()
            if taken:
                return commands.Reply(True)
            return commands.Reply(
                False, error=f"no retiring backend {command.role!r} (pid {command.pid})"
            )
        actions = self.apply(command_socket.observation(command))
        self.publish()
        if self._wake is not None:
            self._wake.set()
        return command_socket.reply(actions)

    # -- reloading the registry ---------------------------------------------------------

    def reload(self, source: str) -> commands.Reply:
        """Read, validate and apply the registry file again (``source``: ``command``,
        ``signal`` or ``file``): refused whole, naming every problem, or applied as the
        difference from the running one (see :mod:`.reload.prepare`), published before the
        reply. Reloads are serialised: each runs whole on the loop."""
        started = self.clock()
        path = self.registry.path
        self.events.emit("config_reload_requested", source=source, config=str(path))
        if self.stopping.is_set():
            return self.refuse(source, Refusal("stopping", ()))
        try:
            prepared = prepare(
                path,
                self.keys,
                self.tools,
                self.settings.log_dir,
                budget_mb=self.settings.memory.budget_mb,
                slot_dir=self.slot_dir,
            )
            found = [] if isinstance(prepared, Refusal) else self.conflicts(prepared)
        except Exception as exc:  # a bug must not take supervision down with it
            log.exception("reload of %s failed", path)
            return self.refuse(source, Refusal("invalid", (f"{path}: cannot be read: {exc!r}",)))
        if isinstance(prepared, Refusal):
            return self.refuse(source, prepared)
        if found:
            return self.refuse(source, Refusal("conflict", tuple(found)))
        generation = self.stamp.generation + 1 if self.stamp is not None else 1
        if not self.publish_registry(prepared.text, generation):
            why = f"{applied_registry.snapshot_path(self.settings.log_dir)} cannot be written"
            return self.refuse(source, Refusal("conflict", (why,)))
        self.apply_registry(prepared)
        assert self.stamp is not None
        diff = prepared.diff
        self.events.emit(
            "config_reloaded",
            source=source,
            config=str(path),
            version=self.stamp.version,
            generation=self.stamp.generation,
            **diff.to_fields(),
            seconds=round(self.clock() - started, 3),
        )
        log.info(
            "reloaded %s (version %s): %d added, %d removed, %d replaced, %d unchanged",
            path,
            self.stamp.version,
            len(diff.added),
            len(diff.removed),
            len(diff.replaced),
            len(diff.unchanged),
        )
        if self._wake is not None:
            self._wake.set()
        return commands.Reply(
            True,
            version=self.stamp.version,
            generation=self.stamp.generation,
            added=diff.added,
            removed=diff.removed,
            replaced=diff.replaced,
            unchanged=diff.unchanged,
        )

    def refuse(self, source: str, refusal: Refusal) -> commands.Reply:
        self.events.emit(
            "config_reload_refused",
            source=source,
            config=str(self.registry.path),
            refused=refusal.kind,
            problems=list(refusal.problems),
        )
        log.error("reload refused: %s", refusal.message)
        return commands.Reply(
            False, error=refusal.message, problems=refusal.problems, refused=refusal.kind
        )

    def conflicts(self, prepared: Prepared) -> list[str]:
        """Why a valid registry cannot be applied now (see :func:`.reload.prepare.conflicts`);
        also one that enables no model (the supervisor would have nothing left)."""
        found = conflicts(
            prepared, self.settings.memory.budget_mb, self.footprint_of, self.port_taken
        )
        if not prepared.registry.enabled:
            found.append(
                f"{prepared.registry.path}: no entry is enabled; the gateway would serve "
                "nothing (stop it instead)"
            )
        return found

    def footprint_of(self, spec: ModelSpec) -> int | None:
        """What ``spec`` would be admitted by: the running backend's footprint when its
        launch is unchanged, else its ``memory_mb``, remembered or estimated one."""
        running = self.backends.get(spec.role)
        key = self.keys.get(spec.role)
        if running is not None and key is not None and running.spec.entry == spec.entry:
            return running.footprint_mb
        expected = self.footprints.expect(spec)
        return admitted_mb(
            spec.entry, expected.remembered_mb, expected.estimate_mb, expected.prompt_cache_mb
        )

    def port_taken(self, spec: ModelSpec, plan: LaunchPlan) -> str | None:
        """Who holds ``plan``'s port when it is not a process of ours. A port one of
        our backends (or retiring processes) listens on counts as ours whoever the
        system says holds it: just after a ``kill -9`` the dying process's socket is
        seen without a pid; its launch frees the port or waits, as a restart does."""
        ours = [*self.backends.values(), *self.retirements.backends()]
        if any(b.spec.entry.port == plan.port for b in ours):
            return None
        holder = self.control.port_holder(plan.host, plan.port)
        if holder is None or self.is_ours(holder, plan):
            return None
        return str(holder)

    def apply_registry(self, prepared: Prepared) -> None:
        """Apply a prepared reload: unchanged backends keep their process (with their
        new entry); removed and replaced ones retire (drained, then stopped); added and
        replacing ones begin, a replacing one held until the process it replaces is
        gone. Reloads spend no restart budget; a replacing backend's starts fresh."""
        # What running tasks reported is decided first, so a process spawned for a
        # backend about to retire is known to be alive, and no report of the old
        # backend reaches the new one of its role.
        while self.inbox:
            self.apply(self.inbox.pop(0))
        diff = prepared.diff
        registry = prepared.registry
        old = self.backends
        disabled = {s.role for s in registry.models if not s.entry.enabled}
        for role in (*diff.removed, *diff.replaced):
            backend = old.get(role)
            if backend is None:
                continue
            gone = role in diff.removed or role in disabled
            reason: RetireReason = "removed" if gone else "replaced"
            record = self.retirements.add(backend, reason)
            if record is not None:
                self.events.emit(
                    "backend_retiring",
                    **backend.life.ids(),
                    pid=record.pid,
                    reason=reason,
                    deadline_seconds=round(record.deadline - record.since, 3),
                )
        fresh = set(diff.added) | set(diff.replaced)
        backends: dict[str, Backend] = {}
        for spec in registry.models:
            if spec.entry.enabled and spec.entry.remote:
                continue
            kept = old.get(spec.role)
            plan = prepared.plans.get(spec.role)
            if kept is not None and spec.role not in fresh:
                kept.spec = spec
                if kept.plan is not None and plan is not None:
                    kept.plan = plan  # same command line; the request defaults may differ
                backends[spec.role] = kept
                continue
            held_by = self.retirements.holder(spec.role, spec.entry.port)
            backends[spec.role] = self.new_backend(spec, plan, reloaded=True, held_by=held_by)
        self.backends = backends
        remotes = [s for s in registry.enabled if s.entry.remote]
        self.remotes.replace(remotes, set(diff.unchanged))
        self.registry = registry
        self.keys = dict(prepared.keys)
        self.registry_text = prepared.text
        self.dirty = True
        self.apply(Begin())
        self.release_held()  # held by a process that was already gone
        self.publish()

    async def retire(self, retiree: Retiree, why: str) -> None:
        """Stop a retiring backend (``why``: drained, deadline, exited) and release the
        backend that waited for its port."""
        record = retiree.record
        if why == "drained" and retiree.child.poll() is None:
            await self.slot_saves.save(retiree.backend)  # its record's tokens: not published
        status, survived = await self.stop_child(retiree.child, kill=False)
        self.retirements.done(record.pid)
        ids = {"role": record.role, "model_id": record.model_id, "port": record.port}
        if survived:
            self.events.emit(
                "process_unkillable",
                **ids,
                pid=record.pid,
                reason="still alive after SIGKILL while retiring; left, not waited on",
            )
        self.events.emit(
            "backend_retired",
            **ids,
            pid=record.pid,
            reason=record.reason,
            ended=why,
            seconds=round(self.wall() - record.since, 3),
        )
        log.info(
            "retired %s (%s) on port %d, pid %d (%s): %s",
            record.role,
            record.model_id,
            record.port,
            record.pid,
            why,
            process.describe_exit(status),
        )
        self.dirty = True
        self.release_held()

    def release_held(self) -> None:
        """Release every held backend that no retiring process blocks any more (by its
        role or its port: a swap of ports holds each on the other's process)."""
        for backend in list(self.backends.values()):
            if not isinstance(backend.life.phase, Held):
                continue
            if self.retirements.holder(backend.role, backend.spec.entry.port) is None:
                self.apply(Released(backend.role))

    async def main(self) -> int:
        status = 1
        try:
            await self.commands.open(self.command)
            status = await self.watch()
            return status
        finally:
            self.commands.close()
            await self.stop_all()
            await self.control.aclose()
            self.events.emit("supervisor_stopped", pid=os.getpid(), exit_status=status)

    def run(self) -> int:
        """Start, watch, stop; the exit status of the ``backends`` command (1 at once,
        touching nothing, when another launcher supervises the same log directory:
        :func:`.launcher_lock.acquire`)."""
        lock = launcher_lock.acquire(self.settings.log_dir, self.events)
        if lock is None:
            return 1
        try:
            self.install_signal_handlers()
            self.sweep_leftovers()
            return asyncio.run(self.main())
        finally:
            lock.release()
