"""The supervisor's decisions. Pure: no I/O; both clocks are passed in.

The shell (:mod:`slm_server.supervise.supervisor`) observes — launch results, process
exits, health probes, the router's restart requests, confirmation verdicts, finished
stops, the clock — and hands each observation (:mod:`.observations`) to :func:`decide`,
which moves the backend's :class:`Lifecycle` to its next phase and returns the actions
(:mod:`.actions`) to carry out, in order: events, log lines, launches, stops, probes
and confirmations.

One backend's restart flow (phases from :mod:`slm_server.contracts.states`)::

    Launching ──spawned──▶ Starting ──/health 200──▶ Ready ──accepted trip──▶ Confirming
        │ failed              │ exited                 │ exited                 │ confirmed
        ▼                     ▼                        ▼                        ▼
    Restarting or FAILED   Restarting ◀─────────────────┴────────────────── Restarting
                                                  not confirmed: back to Ready ─┘
    Restarting ──budget left, cooled down──▶ stop the old process ──▶ Launching(attempt)
    Restarting ──budget spent──▶ ABANDONED

A process exit is never confirmed: it is evidence enough.

A ``load: on_demand`` model begins Unloaded; the router's commands move it::

    Unloaded ──Load──▶ Launching(load) ──spawned──▶ Starting(load) ──/health 200──▶ Ready
    Starting / Ready / Confirming ──Unload──▶ Unloading ──stopped──▶ Unloaded

A backend a reload adds in place of one whose process still drains begins Held, and
is released when that process is gone::

    Held ──Released──▶ Launching ──▶ …     (load: on_demand: Held ──Released──▶ Unloaded)

A load that fails (no process, or one that exits before /health answers) is a failed
start: ``load_failed``, then the restart flow and its budget. Loads and unloads spend
nothing. The router's commands (:class:`LoadRequested`, :class:`UnloadRequested`) are
answered (:class:`Answer`): refused for an unknown role or a ``load: always`` model,
else taken or not by the state the row leaves.

:func:`decide` is the only writer of a :class:`Lifecycle` (a test scans the shell for
any other): the first phase (:class:`Begin`), shutdown (:class:`Shutdown`), the pacing
of health probes (one out at a time, ``Policy.probe_interval_seconds`` apart) and the
footprint worth remembering (:class:`Measured`, :class:`Remember`) are rows here too.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from slm_server.contracts.restart_requests import RestartRequest, is_stale
from slm_server.contracts.states import RUNNING, SUPERVISED, State, check_transition
from slm_server.contracts.verdicts import FailureClass
from slm_server.supervise.core.actions import (
    Action,
    Answer,
    Confirm,
    Emit,
    Launch,
    Log,
    Probe,
    Remember,
    Stop,
)
from slm_server.supervise.core.observations import (
    Begin,
    Exited,
    HealthProbed,
    Judged,
    Launched,
    Load,
    LoadRequested,
    Measured,
    Observation,
    ProbeLost,
    Released,
    Requested,
    Shutdown,
    Stopped,
    Tick,
    Unload,
    UnloadRequested,
)
from slm_server.supervise.core.phases import (
    Attempt,
    Confirming,
    Done,
    Held,
    Launching,
    Phase,
    Ready,
    Restarting,
    Starting,
    Unloaded,
    Unloading,
)
from slm_server.supervise.core.restart_budget import RestartBudget

# Restart reasons as bounded metric labels; a failed launch's message is not one.
RESTART_REASONS = frozenset({"exited", "exited while starting"} | {f.value for f in FailureClass})
# Restarts of a backend that is alive but does not answer: it is killed at once.
WEDGED_REASONS = frozenset({FailureClass.STALL.value, FailureClass.TIMEOUT.value})


@dataclass(frozen=True)
class Policy:
    """The tunables :func:`decide` reads."""

    watchdog_enabled: bool
    restart_window_seconds: float
    startup_grace_seconds: float
    ready_timeout_seconds: float
    confirm: bool = False
    # A request stamped further than this ahead of the supervisor's wall clock is forged
    # or from a skewed clock: it cannot be checked against the grace, so it is discarded.
    future_tolerance_seconds: float = 1.0
    # A starting backend's /health is probed at most this often, one probe at a time.
    probe_interval_seconds: float = 0.0
    # A ready backend measured above its admitted footprint by more than this factor
    # is reported (memory_grew) and remembered at its new size.
    remeasure_growth: float = 1.05


@dataclass
class Lifecycle:
    """Everything :func:`decide` knows about one backend: its phase, its restart
    budget, its process (by pid) and its history for the state file."""

    role: str
    model_id: str
    port: int
    budget: RestartBudget
    phase: Phase = field(default_factory=Launching)  # until :class:`Begin` chooses
    reason: str | None = None
    since: float = 0.0  # wall clock of the last state change
    pid: int | None = None  # the last process spawned (kept after it ends, for events)
    alive: bool = False  # whether ``pid`` is a live process of ours
    started_wall: float | None = None  # wall clock of the last spawn
    restarts: int = 0
    restarts_by_reason: dict[str, int] = field(default_factory=dict)
    last_exit: str | None = None
    last_restart_reason: str | None = None
    on_demand: bool = False  # ``load: on_demand``: may be loaded and unloaded
    # Resident footprint measured when it became ready (its prompt cache still empty),
    # raised when serving outgrows what it is admitted by; the latest measure; the
    # resident size last reported as growth (memory_grew).
    measured_mb: int | None = None
    resident_mb: int | None = None
    grown_mb: int | None = None
    loaded_wall: float | None = None  # wall clock of the last time it became ready
    enabled: bool = True  # the registry's ``enabled``: DISABLED from the start if not
    begun: bool = False  # :class:`Begin` chose its first phase
    probing: bool = False  # a health probe is out
    probe_due: float = 0.0  # monotonic: no probe goes out before
    # Added or replaced by a reload, and not ready since: the router lets requests wait
    # for it as for a load. ``held_by``: the pid of the old process it waits for.
    reloaded: bool = False
    held_by: int | None = None

    @property
    def state(self) -> State:
        return self.phase.state

    def ids(self) -> dict[str, object]:
        """The fields that name this backend in every watchdog event."""
        return {"role": self.role, "model_id": self.model_id, "port": self.port}


# -- the decision -------------------------------------------------------------------------


def decide(
    lives: Mapping[str, Lifecycle],
    observation: Observation,
    now: float,
    wall: float,
    policy: Policy,
) -> list[Action]:
    """Fold one observation into the lifecycles; the actions it calls for, in order.
    ``now`` is monotonic seconds, ``wall`` wall-clock seconds."""
    decision = _Decision(policy, now, wall)
    if isinstance(observation, Tick):
        for life in lives.values():
            decision.tick(life)
    elif isinstance(observation, Begin):
        for life in lives.values():
            decision.begin(life)
    elif isinstance(observation, Shutdown):
        for life in lives.values():
            decision.shutdown(life)
    elif isinstance(observation, Requested):
        decision.requested(lives, observation.request)
    elif isinstance(observation, LoadRequested | UnloadRequested):
        decision.commanded(lives, observation)
    else:
        target = lives.get(observation.role)
        if target is not None:
            decision.observe(target, observation)
    return decision.actions


class _Decision:
    """The actions of one :func:`decide` call, gathered as the transitions run."""

    def __init__(self, policy: Policy, now: float, wall: float) -> None:
        self.policy = policy
        self.now = now
        self.wall = wall
        self.actions: list[Action] = []

    def emit(self, event: str, **fields: Any) -> None:
        self.actions.append(Emit(event, fields))

    def log(self, level: int, message: str) -> None:
        self.actions.append(Log(level, message))

    def move(self, life: Lifecycle, phase: Phase, reason: str | None = None) -> None:
        """Enter ``phase``; a change of published state is checked against the table
        and stamped with ``reason`` and the time."""
        if phase.state is not life.state or phase.state is State.RESTARTING:
            check_transition(life.state, phase.state)
            life.reason = reason
            life.since = self.wall
        life.phase = phase

    def observe(self, life: Lifecycle, observation: Observation) -> None:
        phase = life.phase
        if isinstance(observation, Launched) and isinstance(phase, Launching):
            self.launched(life, phase, observation)
        elif isinstance(observation, Exited):
            # Only a process that is starting or serving exits "by itself": one being
            # stopped (a restart's, an abandoned one's) reports through Stopped.
            serving = isinstance(phase, Starting | Ready | Confirming)
            if serving and observation.pid == life.pid and life.alive:
                self.exited(life, observation)
        elif isinstance(observation, HealthProbed):
            life.probing = False
            if isinstance(phase, Starting):
                self.probed(life, phase, observation)
        elif isinstance(observation, ProbeLost):
            life.probing = False
        elif isinstance(observation, Measured):
            self.measured(life, observation)
        elif isinstance(observation, Stopped) and observation.pid == life.pid:
            self.stopped(life, observation)
        elif isinstance(observation, Judged) and isinstance(phase, Confirming):
            self.judged(life, phase, observation)
        elif isinstance(observation, Load) and life.on_demand:
            self.load(life)
        elif isinstance(observation, Unload) and life.on_demand:
            self.unload(life, observation.reason, observation.for_model)
        elif isinstance(observation, Released) and isinstance(phase, Held):
            self.released(life)

    # (not begun) -> Launching and its first launch; -> Unloaded (``load: on_demand``);
    # -> DISABLED. The first phase is no transition: nothing was published before it.
    def begin(self, life: Lifecycle) -> None:
        if life.begun:
            return
        life.begun = True
        life.since = self.wall
        if not life.enabled:
            life.phase = Done(State.DISABLED)
        elif life.held_by is not None:
            life.phase = Held(life.held_by, load=life.on_demand)
            life.reason = f"waiting for the process it replaces (pid {life.held_by}) to drain"
        elif life.on_demand:
            life.phase = Unloaded()
        else:
            life.phase = Launching()
            self.actions.append(Launch(life.role))

    # any supervised phase -> STOPPED (keeping its reason) once shutdown stopped the
    # processes; a final one stays.
    def shutdown(self, life: Lifecycle) -> None:
        life.alive = False
        if life.state in SUPERVISED:
            self.move(life, Done(State.STOPPED), life.reason)

    # Held -> Launching and its launch (Unloaded for ``load: on_demand``): the process
    # it replaces is gone.
    def released(self, life: Lifecycle) -> None:
        if life.on_demand:
            self.move(life, Unloaded(), "replaced by a reload")
        else:
            self.move(life, Launching(), "replaced by a reload")
            self.actions.append(Launch(life.role))

    # Launching -> Starting when a process was spawned;
    # Launching -> Restarting when it failed for a reason time can fix (watchdog on);
    # Launching -> FAILED when only an edit of the registry can fix it;
    # Launching -> ABANDONED when a retry would exceed the budget.
    def launched(self, life: Lifecycle, phase: Launching, result: Launched) -> None:
        attempt = phase.attempt
        if result.pid is not None:
            life.pid, life.alive, life.started_wall = result.pid, True, self.wall
            starting = Starting(since=self.now, attempt=attempt, load=phase.load)
            self.move(life, starting, attempt.reason if attempt is not None else None)
            return
        failure = result.failure or "launch failed"
        retryable = result.retryable and self.policy.watchdog_enabled
        if attempt is not None:
            self.emit("restart_failed", **life.ids(), reason=failure, attempt=attempt.number)
        elif phase.load:
            self.emit("load_failed", **life.ids(), reason=failure)
        if not retryable:
            self.move(life, Done(State.FAILED), failure)
        elif attempt is not None and life.budget.exhausted(self.now):
            self.abandon(life, self.spent(life, failure))
        else:
            # A retry keeps the reason of the restart it retries (the first launch's is
            # its failure); the state's reason says why this launch failed.
            pending = attempt.reason if attempt is not None else failure
            self.move(life, Restarting(pending, spawned_nothing=True), failure)

    # Starting/Ready/Confirming -> Restarting when the process ends (watchdog on),
    # -> FAILED when the watchdog is off. An exit needs no confirmation.
    def exited(self, life: Lifecycle, exit: Exited) -> None:
        life.alive = False
        life.last_exit = exit.description
        status = exit.status
        signal_name = None
        if status is not None and status < 0:
            signal_name = exit.description.removeprefix("killed by ")
        self.emit(
            "backend_exited",
            **life.ids(),
            pid=exit.pid,
            exit_code=status if status is not None and status >= 0 else None,
            signal=signal_name,
            state=life.state.value,
        )
        lines = "\n".join(f"    {line}" for line in exit.tail)
        self.log(
            logging.ERROR,
            f"{life.role} ({life.model_id}) exited ({exit.description}); "
            f"last lines of {exit.log_path}:\n{lines}",
        )
        phase = life.phase
        # A crash before /health ever answered, the first launch's as a restart's.
        starting = isinstance(phase, Starting)
        if isinstance(phase, Starting) and phase.attempt is not None:
            self.emit(
                "restart_failed",
                **life.ids(),
                reason=f"{exit.description} while starting",
                attempt=phase.attempt.number,
            )
        elif isinstance(phase, Starting) and phase.load:
            self.emit("load_failed", **life.ids(), reason=f"{exit.description} while loading")
        if not self.policy.watchdog_enabled:
            self.move(life, Done(State.FAILED), exit.description)
            return
        self.restart(life, "exited while starting" if starting else "exited")

    # Starting -> Ready on /health 200 (the shell probes only live processes).
    def probed(self, life: Lifecycle, phase: Starting, probe: HealthProbed) -> None:
        elapsed = self.now - phase.since
        if probe.ok:
            if probe.resident_mb is not None:
                self.actions.append(Remember(life.role, probe.resident_mb))
            self.move(life, Ready())
            life.loaded_wall = self.wall
            life.reloaded = False
            life.resident_mb, life.grown_mb = probe.resident_mb, None
            if probe.resident_mb is not None:
                life.measured_mb = probe.resident_mb
            self.log(
                logging.INFO,
                f"{life.role} ({life.model_id}) is ready on port {life.port} after {elapsed:.1f}s",
            )
            if phase.load and phase.attempt is None:
                self.emit(
                    "backend_loaded",
                    **life.ids(),
                    pid=life.pid,
                    seconds=round(elapsed, 3),
                    memory_measured_mb=probe.resident_mb,
                )
            if phase.attempt is not None:
                self.emit(
                    "restart_succeeded",
                    **life.ids(),
                    reason=phase.attempt.reason,
                    old_pid=phase.attempt.old_pid,
                    new_pid=life.pid,
                    attempt=phase.attempt.number,
                    seconds=round(elapsed, 3),
                )
            return
        if elapsed > self.policy.ready_timeout_seconds and not phase.loading_reported:
            life.phase = Starting(phase.since, phase.attempt, loading_reported=True)
            self.log(
                logging.WARNING,
                f"{life.role} ({life.model_id}) is still loading after {elapsed:.0f}s",
            )

    # Restarting(stopping) -> Launching(attempt) once the old process is gone.
    def stopped(self, life: Lifecycle, stop: Stopped) -> None:
        life.alive = False
        if stop.survived:
            self.emit(
                "process_unkillable",
                **life.ids(),
                pid=stop.pid,
                reason="still alive after SIGKILL; left, not waited on",
            )
        phase = life.phase
        if isinstance(phase, Restarting) and phase.stopping is not None:
            self.move(life, Launching(phase.stopping), phase.reason)
            self.actions.append(Launch(life.role))
        elif isinstance(phase, Unloading):
            took = round(self.wall - life.since, 3)  # since the unload began
            self.move(life, Unloaded(), phase.reason)
            self.emit(
                "backend_unloaded",
                **life.ids(),
                pid=stop.pid,
                reason=phase.reason,
                for_model=phase.for_model,
                seconds=took,
            )

    # Unloaded -> Launching(load): the router wants it. Loading or ready already: nothing.
    def load(self, life: Lifecycle) -> None:
        if isinstance(life.phase, Unloaded):
            self.move(life, Launching(load=True))
            self.emit("backend_loading", **life.ids())
            self.actions.append(Launch(life.role))

    # Starting/Ready/Confirming -> Unloading: stop the process, spending no budget.
    # Launching (no process yet), restarting or final: nothing to unload.
    def unload(self, life: Lifecycle, reason: str, for_model: str | None) -> None:
        phase = life.phase
        loaded = life.state in (State.LOADING, State.READY)
        if isinstance(phase, Starting | Ready | Confirming) and loaded and life.pid and life.alive:
            self.move(life, Unloading(reason, for_model), reason)
            # Only a ready one is worth keeping: one starting holds nothing yet, one
            # being confirmed may be wedged.
            self.actions.append(Stop(life.role, life.pid, save=isinstance(phase, Ready)))

    # The router's command: refused for an unknown role or a ``load: always`` model;
    # else the Load or Unload row, taken when it leaves the backend loading or ready
    # (a load), unloading or unloaded (an unload).
    def commanded(
        self, lives: Mapping[str, Lifecycle], command: LoadRequested | UnloadRequested
    ) -> None:
        life = lives.get(command.role)
        if life is None:
            self.actions.append(Answer(False, error=f"no model with role {command.role!r}"))
            return
        if not life.on_demand:
            why = "load: always models are loaded at launch and kept"
            self.actions.append(Answer(False, life.state.value, why))
            return
        if isinstance(command, LoadRequested):
            op = "load"
            self.load(life)
            taken = life.state in (State.LOADING, State.READY)
        else:
            op = "unload"
            self.unload(life, command.reason, command.for_model)
            taken = life.state in (State.UNLOADING, State.UNLOADED)
        state = life.state.value
        if taken:
            self.actions.append(Answer(True, state))
        else:
            self.actions.append(Answer(False, state, f"cannot {op} while {state}"))

    # Ready: the measure is kept for the state file. Resident memory above the admitted
    # footprint raises the measured part to cover it (the prompt cache may be full, so
    # at least ``resident - prompt cache`` is not cache); above it by more than
    # ``remeasure_growth`` (and by as much above the last such report) it is an event,
    # and the new size is remembered.
    def measured(self, life: Lifecycle, measure: Measured) -> None:
        if life.state is not State.READY or not life.alive:
            return
        resident, admitted = measure.resident_mb, measure.admitted_mb
        life.resident_mb = resident
        if admitted is None:
            if life.measured_mb is None:  # nothing known at all: this is the footprint
                life.measured_mb = resident
                self.actions.append(Remember(life.role, resident))
            return
        if resident <= admitted:
            return
        not_cache = resident - (measure.prompt_cache_mb or 0)
        life.measured_mb = max(life.measured_mb or 0, not_cache)
        growth = self.policy.remeasure_growth
        if resident <= admitted * growth:
            return
        if life.grown_mb is not None and resident <= life.grown_mb * growth:
            return
        life.grown_mb = resident
        self.emit(
            "memory_grew",
            **life.ids(),
            resident_mb=resident,
            admitted_mb=admitted,
            prompt_cache_mb=measure.prompt_cache_mb,
        )
        self.actions.append(Remember(life.role, life.measured_mb))

    # Confirming -> Restarting when the evidence says the backend cannot serve;
    # Confirming -> Ready otherwise (the trip is logged as not confirmed).
    def judged(self, life: Lifecycle, phase: Confirming, verdict: Judged) -> None:
        if verdict.restart:
            self.emit(
                "restart_confirmed",
                **life.ids(),
                reason=phase.reason,
                rule=verdict.rule,
                evidence=dict(verdict.evidence),
            )
            life.phase = Ready()
            self.restart(life, phase.reason)
            return
        life.phase = Ready()
        self.emit(
            "restart_not_confirmed",
            **life.ids(),
            reason=phase.reason,
            rule=verdict.rule,
            why=verdict.reason,
            evidence=dict(verdict.evidence),
        )

    # Restarting: retry; Starting: probe /health, one probe out at a time and at most
    # one per ``probe_interval_seconds``.
    def tick(self, life: Lifecycle) -> None:
        phase = life.phase
        if isinstance(phase, Restarting) and phase.stopping is None:
            self.try_restart(life, phase)
        elif isinstance(phase, Starting) and life.alive and self.may_probe(life):
            life.probing = True
            life.probe_due = self.now + self.policy.probe_interval_seconds
            self.actions.append(Probe(life.role))

    def may_probe(self, life: Lifecycle) -> bool:
        return not life.probing and self.now >= life.probe_due

    # any running phase -> Restarting(reason), then at once a restart if it may.
    def restart(self, life: Lifecycle, reason: str) -> None:
        phase = Restarting(reason)
        self.move(life, phase, reason)
        self.try_restart(life, phase)

    # Restarting -> ABANDONED when the budget is spent; stays while cooling down (unless
    # the last attempt spawned nothing); else spends one restart and stops the old
    # process (Restarting(stopping)) or, with none alive, launches (Launching(attempt)).
    def try_restart(self, life: Lifecycle, phase: Restarting) -> None:
        budget = life.budget
        if budget.exhausted(self.now):
            self.abandon(life, self.spent(life, phase.reason))
            return
        if budget.cooling(self.now) and not phase.spawned_nothing:
            return
        number = budget.spend(self.now)
        reason = phase.reason
        life.restarts += 1
        life.last_restart_reason = reason
        kind = reason if reason in RESTART_REASONS else "launch_failed"
        life.restarts_by_reason[kind] = life.restarts_by_reason.get(kind, 0) + 1
        attempt = Attempt(number, life.pid, reason)
        self.emit("restart_started", **life.ids(), reason=reason, old_pid=life.pid, attempt=number)
        if life.alive and life.pid is not None:
            life.phase = Restarting(reason, stopping=attempt)
            self.actions.append(Stop(life.role, life.pid, kill=reason in WEDGED_REASONS))
            return
        self.move(life, Launching(attempt), reason)
        self.actions.append(Launch(life.role))

    def spent(self, life: Lifecycle, reason: str) -> str:
        return (
            f"{life.budget.used} restarts within "
            f"{self.policy.restart_window_seconds:g}s; last reason: {reason}"
        )

    def abandon(self, life: Lifecycle, reason: str) -> None:
        if life.alive and life.pid is not None:
            self.actions.append(Stop(life.role, life.pid))
        self.move(life, Done(State.ABANDONED), reason)
        self.emit("backend_abandoned", **life.ids(), reason=reason)

    # -- the router's restart requests -----------------------------------------------

    def requested(self, lives: Mapping[str, Lifecycle], request: RestartRequest | str) -> None:
        """Act on one restart request, or discard it as stale or forged."""
        if isinstance(request, str):
            self.emit("stale_request_discarded", file=request, reason="unreadable request")
            return
        life = next(
            (x for x in lives.values() if x.role == request.role and x.port == request.port),
            None,
        )
        fields: dict[str, Any] = {
            "role": request.role,
            "model_id": request.model_id,
            "port": request.port,
        }
        if life is None:
            self.emit(
                "stale_request_discarded",
                **fields,
                reason="no such backend in this registry",
                requested_reason=request.reason,
            )
            return
        if life.state not in RUNNING or life.pid is None or not life.alive:
            self.emit(
                "backend_not_running",
                **fields,
                state=life.state.value,
                requested_reason=request.reason,
            )
            return
        started = life.started_wall or 0.0
        grace = self.policy.startup_grace_seconds
        future = request.requested_at > self.wall + self.policy.future_tolerance_seconds
        busy = not isinstance(life.phase, Ready)
        if future or busy or is_stale(request, started, grace):
            if future:
                why = "stamped in the future"
            elif isinstance(life.phase, Confirming):
                why = "a confirmation is under way"
            elif busy:
                why = f"the backend is {life.state.value}"
            else:
                why = "raised before the backend's start plus the startup grace"
            self.emit(
                "stale_request_discarded",
                **fields,
                reason=why,
                requested_reason=request.reason,
                requested_at=request.requested_at,
                started_at=started,
                grace_seconds=grace,
                state=life.state.value,
            )
            return
        if self.policy.confirm:
            life.phase = Confirming(request.reason, request.detail)
            self.actions.append(Confirm(life.role, request.reason))
            return
        self.restart(life, request.reason)
