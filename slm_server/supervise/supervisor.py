"""The ``backends`` command: start one server process per enabled model, watch each
one, restart dead or wedged ones within a bounded budget, and stop them all on
SIGINT/SIGTERM. Every decision goes to the watchdog log.

The shell of :mod:`slm_server.supervise.core.decide`, on one asyncio loop: each turn it
*observes* (process exits, finished launches, probes, stops and confirmations, the
router's restart requests each sweep, the clock), lets :func:`decide` *decide*, and
*acts* (:mod:`.act`) through one :class:`~slm_server.supervise.shell.control.ProcessControl`.
Anything slow (a launch that must free a port, a stop, a probe, a confirmation) runs
as a task of its own with a bound, so no backend's trouble delays another's exit
detection: every process is polled each ``TICK_SECONDS``. A backend is ready when its
``/health`` answers 200 *and* its process is alive.

Only :func:`decide` writes a backend's lifecycle (its first phase, shutdown and the
router's commands included). The loop's collaborators, each on the same process
control: :mod:`.fleet` (the backends, and which process is ours), :mod:`.act`
(launching, stopping, probing, confirming), :mod:`.reload.apply` (the registry in
force, and each reload of it), and the chores: :mod:`.publish` (the state file and
pidfile), :mod:`.footprints` (estimates, measurements, the store),
:mod:`.housekeeping` (leftovers, request files, log trimming, failed chores reported
once) and :mod:`.command_socket` (the router's load and unload). This module keeps the
loop, the dispatch of signals and commands, and the wiring.
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

from slm_server.contracts import commands
from slm_server.contracts.events import EventLog
from slm_server.contracts.restart_requests import RestartRequest
from slm_server.contracts.states import SUPERVISED
from slm_server.launch.plan import Toolchain
from slm_server.registry.schema import RegistryFile
from slm_server.settings import Settings
from slm_server.slotcache.store import SlotStore
from slm_server.supervise.core.actions import Action
from slm_server.supervise.core.decide import Policy, decide
from slm_server.supervise.core.observations import Begin, Observation, Requested, Shutdown, Tick
from slm_server.supervise.core.phases import Starting
from slm_server.supervise.reload.apply import Reloads
from slm_server.supervise.shell import command_socket, launcher_lock
from slm_server.supervise.shell.act import Actor, Shell, Tasks
from slm_server.supervise.shell.backend import Backend
from slm_server.supervise.shell.command_socket import CommandSocket
from slm_server.supervise.shell.control import ProcessControl, RealControl
from slm_server.supervise.shell.fleet import Fleet
from slm_server.supervise.shell.footprints import Footprints
from slm_server.supervise.shell.housekeeping import ChoreErrors, Housekeeping
from slm_server.supervise.shell.publish import Publisher
from slm_server.supervise.shell.remotes import Remotes
from slm_server.supervise.shell.retiring import Retirements
from slm_server.supervise.shell.signal_flag import SignalFlag
from slm_server.supervise.shell.slot_saves import SlotSaves

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
        self.reloads = Reloads(
            shell,
            self.fleet,
            self.tasks,
            self.actor,
            self.remotes,
            self.apply,
            self.publish,
            registry_text,
        )

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
        self.publisher.publish(self.backends.values(), self.remotes, self.reloads.stamp, retiring)

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
        self.reloads.start()  # the backends made, the registry published
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
            self.tasks.spawn(self.reloads.retire(retiree, why))
        if self.reload_asked.is_set():
            self.reload_asked.clear()
            self.reloads.reload("signal")
        if self.reloads.file_changed():
            self.reloads.reload("file")

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
            return self.reloads.reload("command")
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
