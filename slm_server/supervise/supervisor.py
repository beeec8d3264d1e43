"""The ``backends`` command: start one server process per enabled model, watch each
one, restart dead or wedged ones within a bounded budget, and stop them all on
SIGINT/SIGTERM. Every decision goes to the watchdog log.

The shell of :mod:`slm_server.supervise.core.decide`, on one asyncio loop: each turn it
*observes* (process exits, finished launches, probes, stops and confirmations, the
router's restart requests each sweep, the clock), lets :func:`decide` *decide*, and
*acts* (:mod:`.act`) through one :class:`~slm_server.supervise.control.ProcessControl`.
Anything slow (a launch that must free a port, a stop, a probe, a confirmation) runs
as a task of its own with a bound, so no backend's trouble delays another's exit
detection: every process is polled each ``TICK_SECONDS``. A backend is ready when its
``/health`` answers 200 *and* its process is alive.

Only :func:`decide` writes a backend's lifecycle (its first phase, shutdown and the
router's commands included). The loop's collaborators, each on the same process
control: :mod:`.fleet` (the backends, and which process is ours), :mod:`.act`
(launching, stopping, probing, confirming), and the chores: :mod:`.publish` (the
state file and pidfile), :mod:`.footprints` (estimates, measurements, the store),
:mod:`.housekeeping` (leftovers, request files, log trimming, failed chores reported
once) and :mod:`.command_socket` (the router's load and unload). This module keeps the
loop, applying a reload, the dispatch of signals and commands, and the wiring.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable, Mapping
from types import FrameType

from slm_server.contracts import applied_registry, commands
from slm_server.contracts.applied_registry import RegistryStamp, RetireReason
from slm_server.contracts.events import EventLog
from slm_server.contracts.restart_requests import RestartRequest
from slm_server.contracts.states import SUPERVISED
from slm_server.launch.plan import LaunchPlan, Toolchain
from slm_server.registry.schema import ModelSpec, RegistryFile
from slm_server.settings import Settings
from slm_server.slotcache.store import SlotStore
from slm_server.supervise import command_socket, launcher_lock
from slm_server.supervise.act import Actor, Shell, Tasks
from slm_server.supervise.backend import Backend
from slm_server.supervise.command_socket import CommandSocket
from slm_server.supervise.control import ProcessControl, RealControl
from slm_server.supervise.core.actions import Action
from slm_server.supervise.core.decide import Policy, decide
from slm_server.supervise.core.observations import (
    Begin,
    Observation,
    Released,
    Requested,
    Shutdown,
    Tick,
)
from slm_server.supervise.core.phases import Held, Starting
from slm_server.supervise.fleet import Fleet
from slm_server.supervise.footprints import Footprints
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


def policy_of(settings: Settings) -> Policy:
    """The tunables :func:`decide` reads, from the settings."""
    watchdog = settings.watchdog
    return Policy(
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
        self.reload_asked = SignalFlag()  # SIGHUP: reload within a tick
        self.tasks = Tasks()
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
            remotes, self.watchdog, self.control, self.events, clock, wall, self.tasks.spawn
        )
        retirements = Retirements(settings.serving.drain_timeout_seconds, wall)
        self.fleet = Fleet(registry, self.watchdog, self.footprints, self.slot_saves, retirements)
        shell = Shell(
            settings,
            self.tools,
            self.control,
            self.events,
            clock,
            wall,
            self.publisher,
            self.stopping,
            self.slot_dir,
        )
        self.actor = Actor(shell, self.fleet, self.tasks, self.footprints, self.slot_saves)
        # The registry in force (see contracts/applied_registry.py): its text and stamp.
        self.registry_text = registry_text
        self.stamp: RegistryStamp | None = None
        self.watch_file: ConfigWatch | None = None

    @property
    def registry(self) -> RegistryFile:
        """The registry in force."""
        return self.fleet.registry

    @property
    def backends(self) -> dict[str, Backend]:
        """The backends of the registry in force, by role."""
        return self.fleet.backends

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

    @property
    def dirty(self) -> bool:
        """Whether the state file is behind (see :class:`.publish.Publisher`)."""
        return self.publisher.dirty

    @dirty.setter
    def dirty(self, value: bool) -> None:
        self.publisher.dirty = value

    def publish(self) -> None:
        """Write the state file and pidfile when anything changed."""
        retiring = [(r.backend, r.record) for r in self.fleet.retirements.by_pid.values()]
        self.publisher.publish(self.backends.values(), self.remotes, self.stamp, retiring)

    # -- observe -> decide -> act ---------------------------------------------------

    def apply(self, observation: Observation) -> list[Action]:
        """Decide on one observation and carry out what it calls for; the actions (an
        :class:`~slm_server.supervise.core.actions.Answer` among them goes to the caller).

        A change of state is published before the events that report it, so whoever
        reads an event in ``watchdog.jsonl`` finds the state file already agreeing."""
        before = {role: (b.life.state, b.life.reason) for role, b in self.backends.items()}
        actions = decide(self.fleet.lives(), observation, self.clock(), self.wall(), self.policy)
        after = {role: (b.life.state, b.life.reason) for role, b in self.backends.items()}
        if before != after:
            self.dirty = True
            self.publish()
        for action in actions:
            self.actor.act(action)
        return actions

    def observe_exits(self) -> list[Observation]:
        """Poll every live process of a backend that is starting or serving."""
        found = (b.exited(self.control.tail) for b in self.backends.values())
        return [exit for exit in found if exit is not None]

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
        plans, self.fleet.keys, _problems = plan_all(
            self.registry,
            self.tools,
            self.settings.log_dir,
            budget_mb=self.settings.memory.budget_mb,
            slot_dir=self.slot_dir,
        )
        for spec in self.registry.models:
            if spec.role in self.remotes:
                continue  # nothing to start: see Remotes
            self.backends[spec.role] = self.fleet.new_backend(spec, plans.get(spec.role))
        self.stamp_registry()
        self.apply(Begin())  # the first phases, and the first launches

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
        while self.tasks.inbox:
            self.apply(self.tasks.inbox.pop(0))
        self.apply(Tick())
        self.remotes.tick()
        self.dirty = self.dirty or self.remotes.dirty
        for retiree, why in self.fleet.retirements.due():
            retiree.stopping = True
            self.tasks.spawn(self.retire(retiree, why))
        if self.reload_asked.is_set():
            self.reload_asked.clear()
            self.reload("signal")
        if self.watch_file is not None and self.watch_file.due(self.clock()):
            self.reload("file")

    async def watch(self) -> int:
        """Supervise until a stop signal (0) or until no backend is left (1)."""
        wake = self.tasks.wake = asyncio.Event()
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
            wake.clear()
            starting = any(isinstance(b.life.phase, Starting) for b in self.backends.values())
            wait = STARTING_PROBE_SECONDS if starting else TICK_SECONDS
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), wait)
        return 0

    async def stop_all(self) -> None:
        """Stop every backend, all at once."""
        await self.tasks.cancel()
        retirements = self.fleet.retirements
        await self.actor.shutdown([*self.backends.values(), *retirements.backends()])
        retirements.by_pid.clear()
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
            retirements = self.fleet.retirements
            taken = command.pid is not None and retirements.drained(command.role, command.pid)
            self.tasks.wake_loop()
            if taken:
                return commands.Reply(True)
            return commands.Reply(
                False, error=f"no retiring backend {command.role!r} (pid {command.pid})"
            )
        actions = self.apply(command_socket.observation(command))
        self.publish()
        self.tasks.wake_loop()
        return command_socket.reply(actions)

    # -- reloading the registry ---------------------------------------------------------

    def stamp_registry(self) -> None:
        """Publish the registry at start: its snapshot, then (with the state file) its
        stamp."""
        text = self.registry_text
        if text is None:
            try:
                text = self.fleet.registry.path.read_text(encoding="utf-8")
            except OSError:
                text = None
        if text is not None:
            self.registry_text = text
            self.publish_registry(text, 1)
        if self.settings.config_watch:
            self.watch_file = ConfigWatch(
                self.fleet.registry.path, self.settings.config_watch_settle_seconds
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
            str(self.fleet.registry.path),
        )
        self.publisher.dirty = True
        return True

    def reload(self, source: str) -> commands.Reply:
        """Read, validate and apply the registry file again (``source``: ``command``,
        ``signal`` or ``file``): refused whole, naming every problem, or applied as the
        difference from the running one (see :mod:`.reload.prepare`), published before the reply.
        Reloads are serialised: each runs whole on the loop."""
        started = self.clock()
        path = self.fleet.registry.path
        self.events.emit("config_reload_requested", source=source, config=str(path))
        if self.stopping.is_set():
            return self.refuse(source, Refusal("stopping", ()))
        try:
            prepared = prepare(
                path,
                self.fleet.keys,
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
        self.tasks.wake_loop()
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
            config=str(self.fleet.registry.path),
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
            prepared, self.settings.memory.budget_mb, self.fleet.footprint_of, self.port_taken
        )
        if not prepared.registry.enabled:
            found.append(
                f"{prepared.registry.path}: no entry is enabled; the gateway would serve "
                "nothing (stop it instead)"
            )
        return found

    def port_taken(self, spec: ModelSpec, plan: LaunchPlan) -> str | None:
        """Who holds ``plan``'s port when it is not a process of ours. A port one of
        our backends (or retiring processes) listens on counts as ours whoever the
        system says holds it: just after a ``kill -9`` the dying process's socket is
        seen without a pid; its launch frees the port or waits, as a restart does."""
        ours = [*self.fleet.backends.values(), *self.fleet.retirements.backends()]
        if any(b.spec.entry.port == plan.port for b in ours):
            return None
        holder = self.control.port_holder(plan.host, plan.port)
        if holder is None or self.fleet.is_ours(holder, plan):
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
        while self.tasks.inbox:
            self.apply(self.tasks.inbox.pop(0))
        diff = prepared.diff
        registry = prepared.registry
        old = self.fleet.backends
        disabled = {s.role for s in registry.models if not s.entry.enabled}
        for role in (*diff.removed, *diff.replaced):
            backend = old.get(role)
            if backend is None:
                continue
            gone = role in diff.removed or role in disabled
            reason: RetireReason = "removed" if gone else "replaced"
            record = self.fleet.retirements.add(backend, reason)
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
            held_by = self.fleet.retirements.holder(spec.role, spec.entry.port)
            backends[spec.role] = self.fleet.new_backend(spec, plan, reloaded=True, held_by=held_by)
        self.fleet.backends = backends
        remotes = [s for s in registry.enabled if s.entry.remote]
        self.remotes.replace(remotes, set(diff.unchanged))
        self.fleet.registry = registry
        self.fleet.keys = dict(prepared.keys)
        self.registry_text = prepared.text
        self.publisher.dirty = True
        self.apply(Begin())
        self.release_held()  # held by a process that was already gone
        self.publish()

    async def retire(self, retiree: Retiree, why: str) -> None:
        """Stop a retiring backend (``why``: drained, deadline, exited) and release the
        backend that waited for its port."""
        await self.actor.retire(retiree, why)
        self.release_held()

    def release_held(self) -> None:
        """Release every held backend that no retiring process blocks any more (by its
        role or its port: a swap of ports holds each on the other's process)."""
        for backend in list(self.fleet.backends.values()):
            if not isinstance(backend.life.phase, Held):
                continue
            if self.fleet.retirements.holder(backend.role, backend.spec.entry.port) is None:
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
            self.fleet.previous = self.housekeeping.sweep_leftovers()
            return asyncio.run(self.main())
        finally:
            lock.release()
