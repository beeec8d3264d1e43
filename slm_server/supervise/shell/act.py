"""Carrying out what :func:`~slm_server.supervise.core.decide.decide` calls for, on one
:class:`~slm_server.supervise.shell.control.ProcessControl`: events and log lines at once; a
launch (plan, free the port, spawn), a stop (SIGTERM, then SIGKILL), a health probe
and a trip's confirmation each as a task of its own with a bound, reporting back
through the inbox (:class:`Tasks`), which the loop decides on at its next turn. So no
backend's trouble delays another's exit detection. Also the stops outside decide's
rows: a retiring backend's (:mod:`.retiring`) and every process at shutdown.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slm_server.contracts.events import EventLog
from slm_server.launch import process
from slm_server.launch.plan import LaunchPlan, PlanError, Toolchain, plan_launch
from slm_server.settings import Settings
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
    HealthProbed,
    Judged,
    Launched,
    Observation,
    ProbeLost,
    Stopped,
)
from slm_server.supervise.core.phases import Ready
from slm_server.supervise.shell.backend import Backend
from slm_server.supervise.shell.control import Child, ProcessControl
from slm_server.supervise.shell.evidence import Target
from slm_server.supervise.shell.fleet import Fleet
from slm_server.supervise.shell.footprints import Footprints
from slm_server.supervise.shell.publish import Publisher
from slm_server.supervise.shell.retiring import Retiree
from slm_server.supervise.shell.signal_flag import SignalFlag
from slm_server.supervise.shell.slot_saves import SlotSaves

log = logging.getLogger("slm_server.supervisor")

# How long to wait for a process to end after SIGKILL before reporting it and moving on.
KILL_WAIT_SECONDS = 5.0
_REAP_INTERVAL = 0.05


class Tasks:
    """The supervisor's tasks, and the inbox they report to; each one's end wakes the
    loop (``wake``, the loop's own event while it runs)."""

    def __init__(self) -> None:
        self.running: set[asyncio.Task[None]] = set()
        self.inbox: list[Observation] = []
        self.wake: asyncio.Event | None = None

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self.running.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self.running.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("supervisor task failed", exc_info=task.exception())
        self.wake_loop()

    def report(self, observation: Observation) -> None:
        self.inbox.append(observation)

    def wake_loop(self) -> None:
        """Have the loop turn now rather than at its next tick."""
        if self.wake is not None:
            self.wake.set()

    async def cancel(self) -> None:
        """Cancel every task and wait for them all to end."""
        for task in list(self.running):
            task.cancel()
        await asyncio.gather(*self.running, return_exceptions=True)


@dataclass(frozen=True)
class Shell:
    """What the supervisor's collaborators share, made once by it: the settings, the
    launch toolchain, the one process control, the event log, both clocks (monotonic,
    wall), the state file's publisher, the stop flag (SIGINT/SIGTERM: no launch spawns
    and no reload runs once it is set) and where slots are saved (None: not kept)."""

    settings: Settings
    tools: Toolchain
    control: ProcessControl
    events: EventLog
    clock: Callable[[], float]
    wall: Callable[[], float]
    publisher: Publisher
    stopping: SignalFlag
    slot_dir: Path | None


class Actor:
    """Acts on the fleet's processes; what each task finds goes to the inbox."""

    def __init__(
        self, shell: Shell, fleet: Fleet, tasks: Tasks, footprints: Footprints, slots: SlotSaves
    ) -> None:
        self.settings, self.tools, self.control = shell.settings, shell.tools, shell.control
        self.events, self.clock, self.wall = shell.events, shell.clock, shell.wall
        self.publisher, self.stopping = shell.publisher, shell.stopping
        self.slot_dir = shell.slot_dir
        self.fleet = fleet
        self.tasks = tasks
        self.footprints = footprints
        self.slot_saves = slots

    def act(self, action: Action) -> None:
        """Carry out one action: an event or a log line at once, anything slow as a task."""
        if isinstance(action, Emit):
            self.events.emit(action.event, **action.fields)
        elif isinstance(action, Log):
            log.log(action.level, "%s", action.message)
        elif isinstance(action, Launch):
            self.tasks.spawn(self.launch(self.fleet.backends[action.role]))
        elif isinstance(action, Stop):
            backend = self.fleet.backends[action.role]
            if backend.child is not None and backend.child.pid == action.pid:
                self.tasks.spawn(self.stop(backend, backend.child, action.kill, action.save))
        elif isinstance(action, Probe):
            self.tasks.spawn(self.probe(self.fleet.backends[action.role]))
        elif isinstance(action, Remember):
            self.footprints.remember(self.fleet.backends[action.role], action.resident_mb)
            self.publisher.dirty = True
        elif isinstance(action, Confirm):
            self.tasks.spawn(self.confirm(self.fleet.backends[action.role], action.reason))

    async def launch(self, backend: Backend) -> None:
        """Plan and spawn the backend; reports :class:`Launched`."""
        spec = backend.spec
        try:
            plan = plan_launch(
                spec,
                self.tools,
                self.settings.log_dir,
                str(self.fleet.registry.path),
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
            self.tasks.report(Launched(backend.role, None, reason, retryable=exc.missing))
            return
        backend.plan = plan
        refused = await self.free_port(backend, plan)
        if refused is not None:
            log.error("%s (%s): %s", spec.role, spec.entry.id, refused)
            self.tasks.report(Launched(backend.role, None, refused, retryable=True))
            return
        if self.stopping.is_set():
            self.tasks.report(Launched(backend.role, None, "shutting down", retryable=False))
            return
        if not self.fleet.current(backend):
            return  # a reload replaced or removed it while its port was freed
        try:
            child = self.control.spawn(plan)
        except OSError as exc:  # the log could not be opened, the binary not executed
            log.error("%s (%s): cannot start: %s", spec.role, spec.entry.id, exc)
            self.tasks.report(Launched(backend.role, None, f"cannot start: {exc}"))
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
        self.tasks.report(Launched(backend.role, child.pid))

    async def free_port(self, backend: Backend, plan: LaunchPlan) -> str | None:
        """Make sure the backend's port is free (killing a holder only if it is ours);
        why not when it is not."""
        holder = self.control.port_holder(plan.host, plan.port)
        if holder is None:
            return None
        ids = backend.life.ids()
        if not self.fleet.is_ours(holder, plan):
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

    async def stop(self, backend: Backend, child: Child, kill: bool, save: bool) -> None:
        """Stop ``child`` (see :meth:`stop_child`), first saving its slots when ``save``;
        reports :class:`Stopped`."""
        if save and child.poll() is None:
            await self.slot_saves.save(backend)
            self.publisher.dirty = True
        status, survived = await self.stop_child(child, kill)
        self.tasks.report(Stopped(backend.role, child.pid, status, survived))

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
                self.publisher.dirty = True
            resident = self.control.resident_mb(child.pid) if ok and child is not None else None
            answered = True
            if self.fleet.current(backend):
                self.tasks.report(HealthProbed(backend.role, ok, resident))
        finally:
            if not answered and self.fleet.current(backend):
                self.tasks.report(ProbeLost(backend.role))

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
        budget = self.settings.watchdog.confirm_seconds
        try:
            evidence = await self.control.gather_evidence(plan.base_url, target, budget)
        except Exception as exc:
            # A bug here must neither stop supervision nor restart a backend that may
            # well be healthy: the trip is not confirmed.
            log.exception("confirmation of %s failed", spec.entry.id)
            self.tasks.report(Judged(backend.role, False, "confirmation_failed", str(exc)))
            return
        decision = judge(evidence)
        self.tasks.report(
            Judged(
                backend.role,
                decision.restart,
                decision.rule,
                decision.reason,
                evidence.to_fields(),
            )
        )

    async def retire(self, retiree: Retiree, why: str) -> None:
        """Stop a retiring backend (``why``: drained, deadline, exited), its slots saved
        first when it drained."""
        record = retiree.record
        if why == "drained" and retiree.child.poll() is None:
            await self.slot_saves.save(retiree.backend)  # its record's tokens: not published
        status, survived = await self.stop_child(retiree.child, kill=False)
        self.fleet.retirements.done(record.pid)
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
        self.publisher.dirty = True

    async def shutdown(self, backends: Iterable[Backend]) -> None:
        """Stop every live process of ``backends``, all at once."""
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

        await asyncio.gather(
            *(stop(b, b.child) for b in backends if b.child is not None and b.child.poll() is None)
        )
