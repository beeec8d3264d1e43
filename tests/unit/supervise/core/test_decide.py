"""The supervisor's pure core: every row of the restart flow, with plain floats for both
clocks and no process anywhere.

Each test drives :func:`decide` through a :class:`Run`, which checks after every call
that a change of published state is one the transition table allows (a phase set
directly, bypassing ``move``, would otherwise go unchecked).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from slm_server.contracts.restart_requests import RestartRequest
from slm_server.contracts.states import State, check_transition
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
from slm_server.supervise.core.decide import Lifecycle, Policy, decide
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
)
from slm_server.supervise.core.restart_budget import RestartBudget

ROLE, MODEL, PORT = "chat", "m1", 8501
IDS: dict[str, Any] = {"role": ROLE, "model_id": MODEL, "port": PORT}
OTHER = "embed"
OTHER_IDS: dict[str, Any] = {"role": OTHER, "model_id": "e1", "port": 8502}
OLD, NEW, NEWER = 101, 202, 303
T0 = 1000.0  # monotonic
W0 = 1_700_000_000.0  # wall clock
GRACE = 30.0
READY_TIMEOUT = 60.0
WINDOW = 600.0
COOLDOWN = 10.0
TOLERANCE = 5.0
POLICY = Policy(
    watchdog_enabled=True,
    restart_window_seconds=WINDOW,
    startup_grace_seconds=GRACE,
    ready_timeout_seconds=READY_TIMEOUT,
    future_tolerance_seconds=TOLERANCE,
)


def exited(pid: int = OLD, status: int = -9, description: str = "killed by SIGKILL") -> Exited:
    return Exited(ROLE, pid, status, description, ("a", "b"), "/logs/llama-m1-8501.log")


def phase(life: Lifecycle) -> Phase:
    """The phase, read through a call so that mypy does not narrow it across steps."""
    return life.phase


def emit(event: str, **fields: Any) -> Emit:
    return Emit(event, fields)


def events(actions: list[Action]) -> list[str]:
    return [a.event for a in actions if isinstance(a, Emit)]


def lifecycle(
    role: str = ROLE, max_restarts: int = 5, cooldown: float = COOLDOWN, **fields: Any
) -> Lifecycle:
    ids = IDS if role == ROLE else OTHER_IDS
    return Lifecycle(
        role=role,
        model_id=ids["model_id"],
        port=ids["port"],
        budget=RestartBudget(max_restarts, WINDOW, cooldown),
        phase=fields.pop("phase", Launching()),
        since=W0,
        **fields,
    )


@dataclass
class Run:
    """Backends, both clocks and a policy; :meth:`step` decides one observation."""

    lives: dict[str, Lifecycle]
    policy: Policy = POLICY
    now: float = T0
    wall: float = W0
    seen: list[tuple[State, State]] = field(default_factory=list)

    @property
    def life(self) -> Lifecycle:
        return self.lives[ROLE]

    def step(self, observation: Observation, after: float = 0.0) -> list[Action]:
        """Let ``after`` seconds pass on both clocks, then decide ``observation``."""
        self.now += after
        self.wall += after
        before = {role: life.state for role, life in self.lives.items()}
        actions = decide(self.lives, observation, self.now, self.wall, self.policy)
        for role, life in self.lives.items():
            # The first phase (Begin) is no transition: nothing was published before it.
            if life.state is not before[role] and not isinstance(observation, Begin):
                check_transition(before[role], life.state)
                self.seen.append((before[role], life.state))
        return actions

    # -- builders: drive the flow to a phase rather than assemble it by hand -----------

    def starting(self, pid: int = OLD) -> Run:
        assert self.step(Launched(ROLE, pid)) == []
        return self

    def ready(self, pid: int = OLD, after: float = 2.0) -> Run:
        self.starting(pid)
        self.step(HealthProbed(ROLE, True), after)
        assert isinstance(self.life.phase, Ready)
        return self

    def request(self, reason: str = "5xx", at: float | None = None, **fields: Any) -> Requested:
        """A request for the chat backend stamped ``at`` (default: now, past the grace)."""
        stamp = self.wall if at is None else at
        values: dict[str, Any] = {**IDS, "reason": reason, "requested_at": stamp, **fields}
        return Requested(RestartRequest(**values))

    def serving(self, pid: int = OLD) -> Run:
        """Ready, with the startup grace over."""
        self.ready(pid)
        self.now += GRACE + 1
        self.wall += GRACE + 1
        return self

    def restarted(self, reason: str = "exited", old: int = OLD, new: int = NEW) -> Run:
        """Serving ``new`` after one restart (for ``reason``) of ``old``."""
        self.serving(old)
        if reason == "exited":
            self.step(exited(old))
        else:
            self.step(self.request(reason))
            self.step(Stopped(ROLE, old, -15))
        self.step(Launched(ROLE, new))
        self.step(HealthProbed(ROLE, True), 3.0)
        assert isinstance(self.life.phase, Ready)
        assert self.life.pid == new
        return self


def run(*lives: Lifecycle, policy: Policy = POLICY) -> Run:
    return Run({life.role: life for life in (lives or (lifecycle(),))}, policy)


def confirming(grace: float = GRACE) -> Policy:
    return replace(POLICY, confirm=True, startup_grace_seconds=grace)


NO_GRACE = replace(POLICY, startup_grace_seconds=0.0)


# -- the first launch --------------------------------------------------------------------


def test_first_launch_spawned_is_starting() -> None:
    r = run()
    assert r.step(Launched(ROLE, OLD)) == []
    life = r.life
    assert phase(life) == Starting(since=T0)
    assert (life.pid, life.alive, life.started_wall) == (OLD, True, W0)
    assert (life.state, life.reason, life.since) == (State.STARTING, None, W0)


@dataclass(frozen=True)
class FirstFailure:
    name: str
    retryable: bool
    watchdog: bool
    failure: str | None
    state: State
    reason: str


FIRST_FAILURES = [
    FirstFailure(
        "retryable", True, True, "model file missing", State.RESTARTING, "model file missing"
    ),
    FirstFailure("no message", True, True, None, State.RESTARTING, "launch failed"),
    FirstFailure("not retryable", False, True, "bad flag", State.FAILED, "bad flag"),
    FirstFailure(
        "watchdog off", True, False, "model file missing", State.FAILED, "model file missing"
    ),
]


@pytest.mark.parametrize("row", FIRST_FAILURES, ids=lambda row: row.name)
def test_first_launch_failed(row: FirstFailure) -> None:
    r = run(policy=replace(POLICY, watchdog_enabled=row.watchdog))
    # A first launch is no restart: no restart_failed, nothing spent.
    assert r.step(Launched(ROLE, None, row.failure, retryable=row.retryable), 1.0) == []
    life = r.life
    assert (life.state, life.reason, life.since) == (row.state, row.reason, W0 + 1.0)
    assert (life.pid, life.alive, life.restarts, life.budget.used) == (None, False, 0, 0)
    if row.state is State.RESTARTING:
        assert phase(life) == Restarting(row.reason, spawned_nothing=True)
    else:
        assert r.step(Tick(), 60.0) == []


def test_first_launch_failure_retried_on_the_next_tick() -> None:
    r = run()
    r.step(Launched(ROLE, None, "port 8501 is in use by pid 7 (nc)"))
    reason = "port 8501 is in use by pid 7 (nc)"
    assert r.step(Tick()) == [
        emit("restart_started", **IDS, reason=reason, old_pid=None, attempt=1),
        Launch(ROLE),
    ]
    life = r.life
    assert phase(life) == Launching(Attempt(1, None, reason))
    assert (life.state, life.reason) == (State.RESTARTING, reason)
    assert (life.restarts, life.last_restart_reason) == (1, reason)
    # a failure message is not a bounded metric label
    assert life.restarts_by_reason == {"launch_failed": 1}


# -- Starting --------------------------------------------------------------------------


def test_tick_probes_a_starting_backend_only() -> None:
    r = run(lifecycle(), lifecycle(OTHER))
    assert r.step(Tick()) == []  # both launching: nothing to probe
    r.starting()
    assert r.step(Tick()) == [Probe(ROLE)]
    r.step(HealthProbed(ROLE, True))
    assert r.step(Tick()) == []


def test_first_launch_ready_on_probe_ok() -> None:
    r = run().starting()
    actions = r.step(HealthProbed(ROLE, True), 2.5)
    assert actions == [Log(logging.INFO, "chat (m1) is ready on port 8501 after 2.5s")]
    life = r.life
    assert phase(life) == Ready()
    assert (life.state, life.reason, life.since) == (State.READY, None, W0 + 2.5)


def test_restart_succeeded_after_a_restart_only() -> None:
    r = run().serving()
    r.step(exited())
    r.step(Launched(ROLE, NEW), 0.5)
    actions = r.step(HealthProbed(ROLE, True), 4.25)
    assert actions == [
        Log(logging.INFO, "chat (m1) is ready on port 8501 after 4.2s"),
        emit(
            "restart_succeeded",
            **IDS,
            reason="exited",
            old_pid=OLD,
            new_pid=NEW,
            attempt=1,
            seconds=4.25,
        ),
    ]
    assert phase(r.life) == Ready()


def test_failed_probe_within_ready_timeout_is_quiet() -> None:
    r = run().starting()
    assert r.step(HealthProbed(ROLE, False), 1.0) == []
    assert r.step(HealthProbed(ROLE, False), READY_TIMEOUT - 1.0) == []  # exactly at it
    assert phase(r.life) == Starting(T0)


def test_slow_load_warned_once_past_ready_timeout() -> None:
    r = run().starting()
    actions = r.step(HealthProbed(ROLE, False), READY_TIMEOUT + 1.0)
    assert actions == [Log(logging.WARNING, "chat (m1) is still loading after 61s")]
    assert phase(r.life) == Starting(T0, loading_reported=True)
    assert r.life.state is State.STARTING
    assert r.step(HealthProbed(ROLE, False), 30.0) == []
    assert r.step(HealthProbed(ROLE, False), 300.0) == []
    assert r.step(HealthProbed(ROLE, True), 1.0)[0] == Log(
        logging.INFO, "chat (m1) is ready on port 8501 after 392.0s"
    )


def test_slow_load_warning_again_for_a_restart() -> None:
    r = run().starting()
    r.step(HealthProbed(ROLE, False), READY_TIMEOUT + 1.0)
    r.now += GRACE
    r.step(exited())
    r.step(Launched(ROLE, NEW))
    assert phase(r.life) == Starting(r.now, Attempt(1, OLD, "exited while starting"))
    assert len(r.step(HealthProbed(ROLE, False), READY_TIMEOUT + 1.0)) == 1


# -- exits -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Exit:
    name: str
    status: int
    description: str
    exit_code: int | None
    signal: str | None


EXITS = [
    Exit("sigkill", -9, "killed by SIGKILL", None, "SIGKILL"),
    Exit("segv", -11, "killed by SIGSEGV", None, "SIGSEGV"),
    Exit("unnamed signal", -99, "killed by signal 99", None, "signal 99"),
    Exit("code 1", 1, "exit code 1", 1, None),
    Exit("code 0", 0, "exit code 0", 0, None),
]


@pytest.mark.parametrize("row", EXITS, ids=lambda row: row.name)
def test_exit_from_ready_restarts_at_once(row: Exit) -> None:
    r = run().serving()
    actions = r.step(exited(OLD, row.status, row.description), 1.0)
    assert actions == [
        emit(
            "backend_exited",
            **IDS,
            pid=OLD,
            exit_code=row.exit_code,
            signal=row.signal,
            state="ready",
        ),
        Log(
            logging.ERROR,
            f"chat (m1) exited ({row.description}); last lines of "
            "/logs/llama-m1-8501.log:\n    a\n    b",
        ),
        emit("restart_started", **IDS, reason="exited", old_pid=OLD, attempt=1),
        Launch(ROLE),
    ]
    life = r.life
    assert phase(life) == Launching(Attempt(1, OLD, "exited"))
    assert (life.state, life.reason, life.since) == (State.RESTARTING, "exited", r.wall)
    assert (life.alive, life.last_exit) == (False, row.description)
    assert (life.restarts, life.last_restart_reason, life.restarts_by_reason) == (
        1,
        "exited",
        {"exited": 1},
    )


def test_first_crash_while_loading_is_exited_while_starting() -> None:
    # Issue 11, item 4: the very first launch's crash while loading too.
    r = run().starting()
    actions = r.step(exited(), 1.0)
    assert events(actions) == ["backend_exited", "restart_started"]  # no restart_failed
    assert actions[0] == emit(
        "backend_exited", **IDS, pid=OLD, exit_code=None, signal="SIGKILL", state="starting"
    )
    assert actions[2] == emit(
        "restart_started", **IDS, reason="exited while starting", old_pid=OLD, attempt=1
    )
    assert actions[3:] == [Launch(ROLE)]
    assert (r.life.state, r.life.reason) == (State.RESTARTING, "exited while starting")
    assert r.life.restarts_by_reason == {"exited while starting": 1}


def test_restart_that_dies_while_starting_is_a_failed_restart() -> None:
    r = run().serving()
    r.step(exited())
    r.step(Launched(ROLE, NEW))
    actions = r.step(exited(NEW, 1, "exit code 1"), COOLDOWN)
    assert actions[0] == emit(
        "backend_exited", **IDS, pid=NEW, exit_code=1, signal=None, state="starting"
    )
    assert isinstance(actions[1], Log)
    assert actions[2:] == [
        emit("restart_failed", **IDS, reason="exit code 1 while starting", attempt=1),
        emit("restart_started", **IDS, reason="exited while starting", old_pid=NEW, attempt=2),
        Launch(ROLE),
    ]


def test_exit_while_confirming_restarts_without_waiting_for_the_verdict() -> None:
    r = run(policy=confirming()).serving()
    assert r.step(r.request("5xx")) == [Confirm(ROLE, "5xx")]
    actions = r.step(exited())
    assert events(actions) == ["backend_exited", "restart_started"]
    assert actions[0] == emit(
        "backend_exited", **IDS, pid=OLD, exit_code=None, signal="SIGKILL", state="ready"
    )
    assert actions[-1] == Launch(ROLE)
    assert r.life.reason == "exited"
    # the verdict that comes later is for a trip that no longer matters
    assert r.step(Judged(ROLE, True, "stopped", "process stopped")) == []
    assert phase(r.life) == Launching(Attempt(1, OLD, "exited"))


@pytest.mark.parametrize("phase", ["starting", "ready"])
def test_exit_with_watchdog_off_is_failed(phase: str) -> None:
    r = run(policy=replace(POLICY, watchdog_enabled=False))
    r.starting() if phase == "starting" else r.ready()
    actions = r.step(exited(OLD, 2, "exit code 2"), 1.0)
    assert events(actions) == ["backend_exited"]
    assert isinstance(actions[1], Log)
    assert len(actions) == 2
    life = r.life
    assert (life.state, life.reason, life.since, life.alive) == (
        State.FAILED,
        "exit code 2",
        r.wall,
        False,
    )
    assert r.step(Tick(), 100.0) == []


# -- restarts ----------------------------------------------------------------------------

KILL_AT_ONCE = [("stall", True), ("timeout", True)]
STOP_GENTLY = [("5xx", False), ("saturated", False), ("unreachable", False)]
STOP_GENTLY += [("broken_connection", False)]


@pytest.mark.parametrize(("reason", "kill"), KILL_AT_ONCE + STOP_GENTLY)
def test_restart_of_a_live_process_stops_it_then_launches(reason: str, kill: bool) -> None:
    r = run().serving()
    assert r.step(r.request(reason)) == [
        emit("restart_started", **IDS, reason=reason, old_pid=OLD, attempt=1),
        Stop(ROLE, OLD, kill=kill),
    ]
    attempt = Attempt(1, OLD, reason)
    life = r.life
    assert phase(life) == Restarting(reason, stopping=attempt)
    assert (life.state, life.reason, life.since, life.alive) == (
        State.RESTARTING,
        reason,
        r.wall,
        True,
    )
    assert r.step(Tick(), 60.0) == []  # the stop is under way: nothing to retry
    assert r.step(Stopped(ROLE, OLD, -15), 1.0) == [Launch(ROLE)]
    assert phase(life) == Launching(attempt)
    assert (life.state, life.reason, life.since, life.alive) == (
        State.RESTARTING,
        reason,
        r.wall,
        False,
    )
    assert r.step(Launched(ROLE, NEW)) == []
    assert phase(life) == Starting(r.now, attempt)
    assert (life.state, life.reason, life.started_wall) == (State.STARTING, reason, r.wall)
    assert events(r.step(HealthProbed(ROLE, True), 2.0)) == ["restart_succeeded"]
    assert (life.state, life.reason) == (State.READY, None)
    assert (life.restarts, life.restarts_by_reason) == (1, {reason: 1})


def test_restart_with_nothing_alive_launches_at_once() -> None:
    r = run().serving()
    actions = r.step(exited())
    assert [a for a in actions if not isinstance(a, Emit | Log)] == [Launch(ROLE)]
    assert not any(isinstance(a, Stop) for a in actions)


def test_stopped_that_survived_sigkill_is_reported_and_left() -> None:
    r = run().serving()
    r.step(r.request("stall"))
    assert r.step(Stopped(ROLE, OLD, None, survived=True)) == [
        emit(
            "process_unkillable",
            **IDS,
            pid=OLD,
            reason="still alive after SIGKILL; left, not waited on",
        ),
        Launch(ROLE),
    ]
    assert r.life.alive is False
    assert phase(r.life) == Launching(Attempt(1, OLD, "stall"))


def test_stopped_outside_a_restart_changes_nothing_but_liveness() -> None:
    r = run(lifecycle(max_restarts=0)).serving()
    r.step(r.request("5xx"))  # abandoned, with a stop of the live process
    assert r.life.state is State.ABANDONED
    assert r.step(Stopped(ROLE, OLD, -15)) == []
    assert (r.life.state, r.life.alive) == (State.ABANDONED, False)


# -- the cooldown ------------------------------------------------------------------------


def test_cooldown_holds_a_restart_after_an_exit_until_a_tick_past_it() -> None:
    r = run().restarted()  # restart 1 spent at r.now - 3
    spent_at = r.now - 3.0
    actions = r.step(exited(NEW))
    assert events(actions) == ["backend_exited"]
    assert not any(isinstance(a, Launch) for a in actions)
    assert phase(r.life) == Restarting("exited")
    assert (r.life.state, r.life.reason) == (State.RESTARTING, "exited")
    r.now = spent_at + COOLDOWN - 0.01
    assert r.step(Tick()) == []
    r.now = spent_at + COOLDOWN
    assert r.step(Tick()) == [
        emit("restart_started", **IDS, reason="exited", old_pid=NEW, attempt=2),
        Launch(ROLE),
    ]
    assert r.step(Tick()) == []  # only once


def test_cooldown_holds_a_restart_of_a_live_process_then_stops_it() -> None:
    # without a grace, a trip can come within the cooldown of the last restart
    r = run(policy=NO_GRACE).restarted()
    assert r.step(r.request("stall"), 1.0) == []
    assert phase(r.life) == Restarting("stall")
    assert r.life.alive is True
    assert r.step(Tick(), COOLDOWN) == [
        emit("restart_started", **IDS, reason="stall", old_pid=NEW, attempt=2),
        Stop(ROLE, NEW, kill=True),
    ]


def test_no_cooldown_after_a_launch_that_spawned_nothing() -> None:
    r = run().serving()
    r.step(exited())
    actions = r.step(Launched(ROLE, None, "model file missing"), 0.1)
    assert actions == [emit("restart_failed", **IDS, reason="model file missing", attempt=1)]
    assert phase(r.life) == Restarting("exited", spawned_nothing=True)
    assert (r.life.state, r.life.reason) == (State.RESTARTING, "model file missing")
    assert r.step(Tick(), 0.1) == [
        emit("restart_started", **IDS, reason="exited", old_pid=OLD, attempt=2),
        Launch(ROLE),
    ]
    assert phase(r.life) == Launching(Attempt(2, OLD, "exited"))
    assert r.life.restarts_by_reason == {"exited": 2}


# -- the budget ------------------------------------------------------------------------


def test_budget_of_zero_abandons_on_the_first_exit() -> None:
    r = run(lifecycle(max_restarts=0)).serving()
    actions = r.step(exited())
    reason = "0 restarts within 600s; last reason: exited"
    assert events(actions) == ["backend_exited", "backend_abandoned"]
    assert actions[-1] == emit("backend_abandoned", **IDS, reason=reason)
    assert not any(isinstance(a, Stop | Launch) for a in actions)
    assert (r.life.state, r.life.reason, r.life.restarts) == (State.ABANDONED, reason, 0)


def test_budget_spent_abandons_and_stops_the_live_process() -> None:
    r = run(lifecycle(max_restarts=1)).restarted()
    r.now += GRACE
    r.wall += GRACE
    reason = "1 restarts within 600s; last reason: stall"
    assert r.step(r.request("stall")) == [
        Stop(ROLE, NEW),
        emit("backend_abandoned", **IDS, reason=reason),
    ]
    assert (r.life.state, r.life.reason, r.life.since) == (State.ABANDONED, reason, r.wall)
    assert r.step(Tick(), WINDOW) == []  # abandoned is final, whatever the window says


def test_budget_spent_while_cooling_abandons_at_once() -> None:
    r = run(lifecycle(max_restarts=1)).restarted()
    actions = r.step(exited(NEW))
    assert events(actions) == ["backend_exited", "backend_abandoned"]
    assert r.life.state is State.ABANDONED


def test_budget_window_slides() -> None:
    r = run(lifecycle(max_restarts=1)).restarted()
    r.now += WINDOW
    assert events(r.step(exited(NEW))) == ["backend_exited", "restart_started"]
    assert r.life.budget.used == 1


# -- a restart's launch that fails -------------------------------------------------------


def test_failed_restart_launch_not_retryable_is_failed() -> None:
    r = run().serving()
    r.step(exited())
    actions = r.step(Launched(ROLE, None, "bad flag", retryable=False), 1.0)
    assert actions == [emit("restart_failed", **IDS, reason="bad flag", attempt=1)]
    assert (r.life.state, r.life.reason, r.life.since) == (State.FAILED, "bad flag", r.wall)
    assert r.step(Tick(), 60.0) == []


def test_failed_restart_launch_with_the_budget_spent_is_abandoned() -> None:
    r = run(lifecycle(max_restarts=1)).serving()
    r.step(exited())
    actions = r.step(Launched(ROLE, None, "port 8501 is in use"))
    reason = "1 restarts within 600s; last reason: port 8501 is in use"
    assert actions == [
        emit("restart_failed", **IDS, reason="port 8501 is in use", attempt=1),
        emit("backend_abandoned", **IDS, reason=reason),
    ]
    assert (r.life.state, r.life.reason) == (State.ABANDONED, reason)


def test_failed_restart_launch_keeps_the_original_reason() -> None:
    r = run().serving()
    r.step(r.request("stall"))
    r.step(Stopped(ROLE, OLD, -9))
    actions = r.step(Launched(ROLE, None, "port 8501 is in use"), 2.0)
    assert actions == [emit("restart_failed", **IDS, reason="port 8501 is in use", attempt=1)]
    life = r.life
    assert phase(life) == Restarting("stall", spawned_nothing=True)
    assert (life.state, life.reason, life.since) == (
        State.RESTARTING,
        "port 8501 is in use",
        r.wall,
    )
    retry = r.step(Tick())
    assert retry[0] == emit("restart_started", **IDS, reason="stall", old_pid=OLD, attempt=2)
    assert retry[1:] == [Launch(ROLE)]  # nothing alive to stop, so no SIGKILL either
    assert life.restarts_by_reason == {"stall": 2}


# -- the router's restart requests -------------------------------------------------------


def test_unreadable_request_is_discarded_by_name() -> None:
    r = run().serving()
    assert r.step(Requested("8501-chat-1.json")) == [
        emit("stale_request_discarded", file="8501-chat-1.json", reason="unreadable request")
    ]
    assert r.life.state is State.READY


@pytest.mark.parametrize(
    "target", [{"role": "nope"}, {"port": 9999}, {"role": OTHER}], ids=["role", "port", "mixed"]
)
def test_request_for_an_unknown_backend_is_discarded(target: dict[str, Any]) -> None:
    r = run(lifecycle(), lifecycle(OTHER)).serving()
    fields = {**IDS, **target}
    assert r.step(r.request("5xx", **target)) == [
        emit(
            "stale_request_discarded",
            **fields,
            reason="no such backend in this registry",
            requested_reason="5xx",
        )
    ]


def _launching(r: Run) -> None:
    pass


def _restarting_dead(r: Run) -> None:
    r.serving()
    r.step(exited())
    r.step(Launched(ROLE, None, "model file missing"))


def _failed(r: Run) -> None:
    r.step(Launched(ROLE, None, "bad flag", retryable=False))


def _abandoned(r: Run) -> None:
    r.lives[ROLE] = lifecycle(max_restarts=0)
    r.serving()
    r.step(exited())


def _disabled(r: Run) -> None:
    r.lives[ROLE] = lifecycle(phase=Done(State.DISABLED))


NOT_RUNNING: list[tuple[str, Callable[[Run], None], str]] = [
    ("launching", _launching, "starting"),
    ("restarting, nothing alive", _restarting_dead, "restarting"),
    ("failed", _failed, "failed"),
    ("abandoned", _abandoned, "abandoned"),
    ("disabled", _disabled, "disabled"),
]


@pytest.mark.parametrize(
    ("setup", "state"), [row[1:] for row in NOT_RUNNING], ids=[row[0] for row in NOT_RUNNING]
)
def test_request_for_a_backend_not_running(setup: Callable[[Run], None], state: str) -> None:
    r = run()
    setup(r)
    r.now += 100.0
    r.wall += 100.0
    before = (r.life.phase, r.life.budget.used)
    assert r.step(r.request("5xx")) == [
        emit("backend_not_running", **IDS, state=state, requested_reason="5xx")
    ]
    assert (r.life.phase, r.life.budget.used) == before


def test_request_while_restarting_a_live_process_is_discarded() -> None:
    r = run().serving()
    r.step(r.request("stall"))
    started = r.life.started_wall
    stamp = r.wall
    actions = r.step(r.request("5xx"), 1.0)
    assert actions == [
        emit(
            "stale_request_discarded",
            **IDS,
            reason="the backend is restarting",
            requested_reason="5xx",
            requested_at=stamp,
            started_at=started,
            grace_seconds=GRACE,
            state="restarting",
        )
    ]
    assert phase(r.life) == Restarting("stall", stopping=Attempt(1, OLD, "stall"))
    assert r.life.budget.used == 1


def test_request_for_a_backend_still_loading_past_the_grace_is_discarded() -> None:
    # Only a serving backend is restarted on the router's word: a slow load is the
    # ready timeout's business.
    r = run().starting()
    r.now += GRACE + 5.0
    r.wall += GRACE + 5.0
    actions = r.step(r.request("unreachable"))
    assert actions == [
        emit(
            "stale_request_discarded",
            **IDS,
            reason="the backend is starting",
            requested_reason="unreachable",
            requested_at=r.wall,
            started_at=W0,
            grace_seconds=GRACE,
            state="starting",
        )
    ]
    assert phase(r.life) == Starting(T0)
    assert r.life.budget.used == 0


@pytest.mark.parametrize(
    "stamp", [W0 - 1.0, W0 + 1.0, W0 + GRACE - 0.001], ids=["before start", "loading", "edge"]
)
def test_request_before_start_plus_grace_is_stale(stamp: float) -> None:
    r = run().ready()
    started = W0
    r.wall = started + GRACE + 5.0
    assert r.step(r.request("5xx", at=stamp)) == [
        emit(
            "stale_request_discarded",
            **IDS,
            reason="raised before the backend's start plus the startup grace",
            requested_reason="5xx",
            requested_at=stamp,
            started_at=started,
            grace_seconds=GRACE,
            state="ready",
        )
    ]
    assert phase(r.life) == Ready()


def test_request_stale_against_the_restarted_process() -> None:
    r = run().restarted()  # NEW started at r.wall - 3
    stamp = r.wall - 1.0  # after the old start + grace, before the new one's
    assert events(r.step(r.request("5xx", at=stamp))) == ["stale_request_discarded"]


def test_request_at_exactly_start_plus_grace_is_accepted() -> None:
    r = run().ready()
    r.wall = W0 + GRACE
    assert events(r.step(r.request("5xx", at=W0 + GRACE))) == ["restart_started"]


def test_request_stamped_in_the_future_is_discarded() -> None:
    r = run().serving()
    stamp = r.wall + TOLERANCE + 0.5
    assert r.step(r.request("5xx", at=stamp)) == [
        emit(
            "stale_request_discarded",
            **IDS,
            reason="stamped in the future",
            requested_reason="5xx",
            requested_at=stamp,
            started_at=W0,
            grace_seconds=GRACE,
            state="ready",
        )
    ]
    assert phase(r.life) == Ready()


def test_request_stamped_within_the_future_tolerance_is_accepted() -> None:
    r = run().serving()
    assert events(r.step(r.request("5xx", at=r.wall + TOLERANCE))) == ["restart_started"]


def test_future_request_is_discarded_even_while_loading() -> None:
    # A far-future stamp would otherwise pass any grace check.
    r = run().starting()
    r.wall += 1.0
    actions = r.step(r.request("5xx", at=r.wall + 10_000.0))
    assert events(actions) == ["stale_request_discarded"]
    assert isinstance(actions[0], Emit)
    assert actions[0].fields["reason"] == "stamped in the future"


def test_accepted_request_restarts() -> None:
    r = run().serving()
    actions = r.step(r.request("5xx", detail="2 consecutive 5xx"))
    assert actions == [
        emit("restart_started", **IDS, reason="5xx", old_pid=OLD, attempt=1),
        Stop(ROLE, OLD, kill=False),
    ]


def test_request_picks_its_backend_by_role_and_port() -> None:
    r = run(lifecycle(), lifecycle(OTHER))
    r.serving()
    r.step(Launched(OTHER, 404))
    r.step(HealthProbed(OTHER, True))
    r.wall += GRACE
    request = RestartRequest(OTHER, "e1", 8502, "stall", r.wall)
    assert r.step(Requested(request)) == [
        emit("restart_started", **OTHER_IDS, reason="stall", old_pid=404, attempt=1),
        Stop(OTHER, 404, kill=True),
    ]
    assert phase(r.life) == Ready()


def test_accepted_request_with_confirmation_is_confirmed_first() -> None:
    r = run(policy=confirming()).serving()
    since = r.life.since
    actions = r.step(r.request("timeout", detail="2 consecutive timeouts"), 1.0)
    assert actions == [Confirm(ROLE, "timeout")]
    life = r.life
    assert phase(life) == Confirming("timeout", "2 consecutive timeouts")
    # Confirming is published as READY: the router keeps sending traffic meanwhile
    assert (life.state, life.reason, life.since) == (State.READY, None, since)
    assert (life.budget.used, life.restarts) == (0, 0)


@pytest.mark.parametrize("reason", ["5xx", "stall"])
def test_request_while_confirming_is_discarded(reason: str) -> None:
    r = run(policy=confirming()).serving()
    r.step(r.request("timeout"))
    stamp = r.wall
    actions = r.step(r.request(reason), 1.0)
    assert actions == [
        emit(
            "stale_request_discarded",
            **IDS,
            reason="a confirmation is under way",
            requested_reason=reason,
            requested_at=stamp,
            started_at=W0,
            grace_seconds=GRACE,
            state="ready",
        )
    ]
    assert phase(r.life) == Confirming("timeout")


# -- confirmation verdicts ---------------------------------------------------------------

EVIDENCE = {"process": "stopped", "cpu_seconds": 0.0}


@pytest.mark.parametrize(("reason", "kill"), [("timeout", True), ("5xx", False)])
def test_confirmed_trip_restarts(reason: str, kill: bool) -> None:
    r = run(policy=confirming()).serving()
    r.step(r.request(reason))
    actions = r.step(Judged(ROLE, True, "process stopped", "SIGSTOPped", EVIDENCE), 2.0)
    assert actions == [
        emit("restart_confirmed", **IDS, reason=reason, rule="process stopped", evidence=EVIDENCE),
        emit("restart_started", **IDS, reason=reason, old_pid=OLD, attempt=1),
        Stop(ROLE, OLD, kill=kill),
    ]
    life = r.life
    assert phase(life) == Restarting(reason, stopping=Attempt(1, OLD, reason))
    assert (life.state, life.reason, life.since) == (State.RESTARTING, reason, r.wall)


def test_confirmed_trip_during_cooldown_waits_for_a_tick() -> None:
    r = run(policy=confirming(grace=0.0)).restarted()
    r.step(r.request("5xx"))
    actions = r.step(Judged(ROLE, True, "health failed", "no answer"))
    assert events(actions) == ["restart_confirmed"]
    assert phase(r.life) == Restarting("5xx")
    assert events(r.step(Tick(), COOLDOWN)) == ["restart_started"]


def test_unconfirmed_trip_goes_back_to_ready() -> None:
    r = run(policy=confirming()).serving()
    since = r.life.since
    r.step(r.request("5xx"))
    actions = r.step(Judged(ROLE, False, "canary ok", "the canary completed", EVIDENCE), 2.0)
    assert actions == [
        emit(
            "restart_not_confirmed",
            **IDS,
            reason="5xx",
            rule="canary ok",
            why="the canary completed",
            evidence=EVIDENCE,
        )
    ]
    life = r.life
    assert phase(life) == Ready()
    assert (life.state, life.reason, life.since, life.budget.used) == (State.READY, None, since, 0)
    # and a later trip is confirmed afresh
    assert r.step(r.request("5xx")) == [Confirm(ROLE, "5xx")]


def test_evidence_is_copied_into_the_event() -> None:
    r = run(policy=confirming()).serving()
    r.step(r.request("5xx"))
    evidence = {"health": 500}
    actions = r.step(Judged(ROLE, False, "r", "w", evidence))
    evidence["health"] = 200
    assert isinstance(actions[0], Emit)
    assert actions[0].fields["evidence"] == {"health": 500}


# -- observations that do not apply ------------------------------------------------------


def _at_ready(r: Run) -> None:
    r.serving()


def _at_restarting_stop(r: Run) -> None:
    r.serving()
    r.step(r.request("stall"))


def _after_restart(r: Run) -> None:
    r.restarted()


IGNORED: list[tuple[str, Callable[[Run], None], Observation]] = [
    ("exit of the old pid after a restart", _after_restart, exited(OLD)),
    ("exit of an unknown pid", _at_ready, exited(999)),
    ("exit of a process no longer alive", _restarting_dead, exited(OLD)),
    ("probe while launching", _launching, HealthProbed(ROLE, True)),
    ("probe while ready", _at_ready, HealthProbed(ROLE, False)),
    ("probe while restarting", _at_restarting_stop, HealthProbed(ROLE, True)),
    ("verdict while ready", _at_ready, Judged(ROLE, True, "r", "w")),
    ("verdict while restarting", _at_restarting_stop, Judged(ROLE, True, "r", "w")),
    ("launch result while ready", _at_ready, Launched(ROLE, NEW)),
    ("launch result while stopping", _at_restarting_stop, Launched(ROLE, NEW)),
    ("stop of another pid", _at_restarting_stop, Stopped(ROLE, 999, -9)),
    ("stop of the old pid after a restart", _after_restart, Stopped(ROLE, OLD, -9)),
    ("observation for an unknown role", _at_ready, Exited("x", OLD, -9, "killed by SIGKILL")),
    ("tick while ready", _at_ready, Tick()),
    ("tick while failed", _failed, Tick()),
]


@pytest.mark.parametrize(
    ("setup", "observation"), [row[1:] for row in IGNORED], ids=[row[0] for row in IGNORED]
)
def test_observation_that_does_not_apply_is_ignored(
    setup: Callable[[Run], None], observation: Observation
) -> None:
    r = run(lifecycle(), lifecycle(OTHER))
    setup(r)
    life = r.life
    before = (life.phase, life.state, life.reason, life.since, life.pid, life.alive)
    used = life.budget.used
    assert r.step(observation, 1.0) == []
    assert (life.phase, life.state, life.reason, life.since, life.pid, life.alive) == before
    assert life.budget.used == used


# -- a whole tour, against the transition table ------------------------------------------


def test_a_long_tour_only_takes_allowed_transitions() -> None:
    r = run(lifecycle(max_restarts=3), policy=confirming())
    r.step(Launched(ROLE, None, "model file missing"))  # STARTING -> RESTARTING
    r.step(Tick())  # restart 1: launch
    r.step(Launched(ROLE, OLD))  # RESTARTING -> STARTING
    r.step(HealthProbed(ROLE, True), 1.0)  # STARTING -> READY
    r.wall += GRACE
    r.step(r.request("5xx"))  # confirming, still READY
    r.step(Judged(ROLE, False, "canary ok", "fine"))
    r.step(r.request("stall"))
    r.step(Judged(ROLE, True, "stopped", "SIGSTOP"), COOLDOWN)  # READY -> RESTARTING, stop
    r.step(Stopped(ROLE, OLD, None, survived=True))  # Launching(attempt 2)
    r.step(Launched(ROLE, NEW))  # RESTARTING -> STARTING
    r.step(exited(NEW), COOLDOWN)  # STARTING -> RESTARTING, restart 3
    r.step(Launched(ROLE, NEWER))
    r.step(HealthProbed(ROLE, True))
    r.step(exited(NEWER), COOLDOWN)  # READY -> ABANDONED
    assert r.life.state is State.ABANDONED
    assert r.seen == [
        (State.STARTING, State.RESTARTING),
        (State.RESTARTING, State.STARTING),
        (State.STARTING, State.READY),
        (State.READY, State.RESTARTING),
        (State.RESTARTING, State.STARTING),
        (State.STARTING, State.RESTARTING),
        (State.RESTARTING, State.STARTING),
        (State.STARTING, State.READY),
        (State.READY, State.ABANDONED),
    ]
    assert r.life.restarts == 3
    assert r.life.restarts_by_reason == {
        "launch_failed": 1,
        "stall": 1,
        "exited while starting": 1,
    }


# -- load: on_demand -------------------------------------------------------------------


def state(life: Lifecycle) -> State:
    """The state, read through a call so that mypy does not narrow it across steps."""
    return life.state


def on_demand(**fields: Any) -> Lifecycle:
    return lifecycle(phase=Unloaded(), on_demand=True, **fields)


def test_an_on_demand_model_loads_on_the_routers_command_spending_nothing() -> None:
    r = run(on_demand())
    assert r.step(Tick()) == []  # unloaded: nothing to probe, nothing to start
    actions = r.step(Load(ROLE))
    assert actions == [emit("backend_loading", **IDS), Launch(ROLE)]
    assert state(r.life) is State.LOADING
    assert r.step(Launched(ROLE, OLD)) == []
    assert state(r.life) is State.LOADING
    assert r.step(Tick()) == [Probe(ROLE)]
    actions = r.step(HealthProbed(ROLE, True, resident_mb=812), 1.5)
    assert state(r.life) is State.READY
    assert emit("backend_loaded", **IDS, pid=OLD, seconds=1.5, memory_measured_mb=812) in actions
    assert r.life.measured_mb == 812
    assert r.life.loaded_wall == r.wall
    assert r.life.budget.used == 0
    assert r.life.restarts == 0


def test_a_second_load_while_loading_or_ready_does_nothing() -> None:
    r = run(on_demand())
    r.step(Load(ROLE))
    assert r.step(Load(ROLE)) == []
    r.step(Launched(ROLE, OLD))
    assert r.step(Load(ROLE)) == []
    r.step(HealthProbed(ROLE, True))
    assert r.step(Load(ROLE)) == []
    assert state(r.life) is State.READY


def test_only_a_ready_backend_s_slots_are_saved_on_unload() -> None:
    """One still loading holds nothing worth keeping; one whose trip is being confirmed
    may be wedged: asking it to save would only wait, and keep a broken state."""
    loading = run(on_demand())
    loading.step(Load(ROLE))
    loading.step(Launched(ROLE, OLD))
    assert loading.step(Unload(ROLE, "api", None)) == [Stop(ROLE, OLD, save=False)]


def test_an_unload_stops_the_process_and_ends_unloaded_spending_nothing() -> None:
    r = run(on_demand())
    r.step(Load(ROLE))
    r.step(Launched(ROLE, OLD))
    r.step(HealthProbed(ROLE, True))
    actions = r.step(Unload(ROLE, "evicted", "m2"))
    assert actions == [Stop(ROLE, OLD, save=True)]  # a ready one's slots are kept
    assert state(r.life) is State.UNLOADING
    assert r.life.reason == "evicted"
    # The process going away while it is unloaded is no failure.
    assert r.step(exited(OLD)) == []
    actions = r.step(Stopped(ROLE, OLD, -15), 0.5)
    unloaded = emit(
        "backend_unloaded", **IDS, pid=OLD, reason="evicted", for_model="m2", seconds=0.5
    )
    assert actions == [unloaded]
    assert state(r.life) is State.UNLOADED
    assert r.life.budget.used == 0
    # And it loads again.
    assert r.step(Load(ROLE))[-1] == Launch(ROLE)
    r.step(Launched(ROLE, NEW))
    r.step(HealthProbed(ROLE, True))
    assert r.life.pid == NEW
    assert (State.UNLOADING, State.UNLOADED) in r.seen


def test_a_load_still_loading_can_be_unloaded() -> None:
    r = run(on_demand())
    r.step(Load(ROLE))
    assert r.step(Unload(ROLE, "api")) == []  # no process yet: nothing to stop
    assert state(r.life) is State.LOADING
    r.step(Launched(ROLE, OLD))
    assert r.step(Unload(ROLE, "api")) == [Stop(ROLE, OLD)]
    r.step(Stopped(ROLE, OLD, -15))
    assert state(r.life) is State.UNLOADED


def test_always_models_ignore_load_and_unload() -> None:
    r = run().serving()
    assert r.step(Unload(ROLE, "api")) == []
    assert r.step(Load(ROLE)) == []
    assert state(r.life) is State.READY


def test_a_load_that_exits_is_a_failed_start_and_spends_the_budget() -> None:
    r = run(on_demand())
    r.step(Load(ROLE))
    r.step(Launched(ROLE, OLD))
    actions = r.step(exited(OLD, 1, "exited with status 1"))
    names = events(actions)
    assert "load_failed" in names
    assert emit("load_failed", **IDS, reason="exited with status 1 while loading") in actions
    assert names[-1] == "restart_started"
    assert r.life.budget.used == 1
    assert state(r.life) is State.RESTARTING


def test_a_load_that_cannot_launch_is_a_failed_load() -> None:
    r = run(on_demand())
    r.step(Load(ROLE))
    actions = r.step(Launched(ROLE, None, "port 8501 is taken"))
    assert emit("load_failed", **IDS, reason="port 8501 is taken") in actions
    assert state(r.life) is State.RESTARTING


def test_a_restart_request_for_an_unloaded_model_is_not_acted_on() -> None:
    r = run(on_demand())
    actions = r.step(r.request("5xx"))
    assert events(actions) == ["backend_not_running"]
    assert state(r.life) is State.UNLOADED


# -- the first phase (Begin) -------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "first", "actions"),
    [
        ({}, Launching(), [Launch(ROLE)]),
        ({"on_demand": True}, Unloaded(), []),
        ({"enabled": False}, Done(State.DISABLED), []),
        ({"enabled": False, "on_demand": True}, Done(State.DISABLED), []),
    ],
    ids=["always", "on demand", "disabled", "disabled on demand"],
)
def test_begin_chooses_the_first_phase(
    fields: dict[str, Any], first: Phase, actions: list[Action]
) -> None:
    r = run(lifecycle(**fields))
    assert r.step(Begin(), 5.0) == actions
    assert phase(r.life) == first
    assert (r.life.since, r.life.reason, r.life.begun) == (W0 + 5.0, None, True)
    assert r.step(Begin(), 1.0) == []  # once only: no second first launch
    assert r.life.since == W0 + 5.0


def test_begin_begins_every_backend_in_order() -> None:
    r = run(lifecycle(), lifecycle(OTHER))
    assert r.step(Begin()) == [Launch(ROLE), Launch(OTHER)]


# -- shutdown --------------------------------------------------------------------------


def _unloaded(r: Run) -> None:
    r.lives[ROLE] = on_demand()


SHUTDOWNS: list[tuple[str, Callable[[Run], None], State]] = [
    ("launching", _launching, State.STOPPED),
    ("ready", _at_ready, State.STOPPED),
    ("restarting", _restarting_dead, State.STOPPED),
    ("stopping for a restart", _at_restarting_stop, State.STOPPED),
    ("unloaded", _unloaded, State.STOPPED),
    ("failed", _failed, State.FAILED),
    ("abandoned", _abandoned, State.ABANDONED),
]


@pytest.mark.parametrize(
    ("setup", "final"), [row[1:] for row in SHUTDOWNS], ids=[row[0] for row in SHUTDOWNS]
)
def test_shutdown_stops_every_supervised_backend_keeping_its_reason(
    setup: Callable[[Run], None], final: State
) -> None:
    r = run(lifecycle(), lifecycle(OTHER))
    setup(r)
    life = r.life
    reason, since = life.reason, life.since
    assert r.step(Shutdown(), 2.0) == []  # the shell stopped the processes already
    assert (life.state, life.reason, life.alive) == (final, reason, False)
    assert life.since == (r.wall if final is State.STOPPED else since)
    assert r.lives[OTHER].state is State.STOPPED


def test_nothing_moves_a_backend_after_shutdown() -> None:
    r = run().serving()
    r.step(Shutdown())
    for observation in (exited(), Tick(), r.request("5xx"), HealthProbed(ROLE, True)):
        r.step(observation, 1.0)
        assert r.life.state is State.STOPPED


# -- pacing the health probes ------------------------------------------------------------

PACED = replace(POLICY, probe_interval_seconds=0.05)


def test_one_probe_is_out_at_a_time() -> None:
    r = run(policy=PACED).starting()
    assert r.step(Tick()) == [Probe(ROLE)]
    assert r.step(Tick(), 1.0) == []  # still out, however long it takes
    r.step(HealthProbed(ROLE, False))
    assert r.step(Tick()) == [Probe(ROLE)]


def test_probes_go_out_at_most_once_per_interval() -> None:
    r = run(policy=PACED).starting()
    assert r.step(Tick()) == [Probe(ROLE)]
    r.step(HealthProbed(ROLE, False), 0.01)
    assert r.step(Tick(), 0.03) == []  # 0.04 s after the last one went out
    assert r.step(Tick(), 0.01) == [Probe(ROLE)]


def test_a_lost_probe_lets_the_next_one_go_out() -> None:
    r = run(policy=PACED).starting()
    r.step(Tick())
    assert r.step(ProbeLost(ROLE), 1.0) == []
    assert r.life.state is State.STARTING  # no answer is no failed probe
    assert r.step(Tick()) == [Probe(ROLE)]


def test_a_probe_still_out_across_a_restart_holds_the_next_one() -> None:
    r = run(policy=PACED).starting(OLD)
    r.step(Tick())  # a probe of OLD goes out, and hangs
    r.step(exited(OLD))
    r.step(Launched(ROLE, NEW), 1.0)
    assert r.life.state is State.STARTING
    assert r.step(Tick()) == []
    r.step(HealthProbed(ROLE, False))
    assert r.step(Tick()) == [Probe(ROLE)]


# -- the router's commands, answered -----------------------------------------------------


def test_a_command_for_an_unknown_role_is_refused() -> None:
    r = run(on_demand())
    refused = Answer(False, None, "no model with role 'zzz'")
    assert r.step(LoadRequested("zzz")) == [refused]
    assert r.step(UnloadRequested("zzz", "api")) == [refused]
    assert r.life.state is State.UNLOADED


def test_a_command_for_an_always_model_is_refused_whatever_its_state() -> None:
    r = run().serving()
    why = "load: always models are loaded at launch and kept"
    assert r.step(UnloadRequested(ROLE, "api")) == [Answer(False, "ready", why)]
    assert r.step(LoadRequested(ROLE)) == [Answer(False, "ready", why)]
    assert r.life.state is State.READY


def test_a_load_is_taken_then_answered() -> None:
    r = run(on_demand())
    assert r.step(LoadRequested(ROLE)) == [
        emit("backend_loading", **IDS),
        Launch(ROLE),
        Answer(True, "loading"),
    ]
    assert r.step(LoadRequested(ROLE)) == [Answer(True, "loading")]  # already
    r.step(Launched(ROLE, OLD))
    r.step(HealthProbed(ROLE, True))
    assert r.step(LoadRequested(ROLE)) == [Answer(True, "ready")]


def test_an_unload_is_taken_then_answered() -> None:
    r = run(on_demand())
    r.step(LoadRequested(ROLE))
    r.step(Launched(ROLE, OLD))
    r.step(HealthProbed(ROLE, True))
    actions = r.step(UnloadRequested(ROLE, "evicted", "m2"))
    assert actions == [Stop(ROLE, OLD, save=True), Answer(True, "unloading")]
    assert (r.life.state, r.life.reason) == (State.UNLOADING, "evicted")
    assert r.step(LoadRequested(ROLE)) == [
        Answer(False, "unloading", "cannot load while unloading")
    ]
    r.step(Stopped(ROLE, OLD, -15))
    assert r.step(UnloadRequested(ROLE, "api")) == [Answer(True, "unloaded")]


def test_an_unload_before_any_process_is_refused() -> None:
    r = run(on_demand())
    r.step(LoadRequested(ROLE))
    assert r.step(UnloadRequested(ROLE, "no_waiter")) == [
        Answer(False, "loading", "cannot unload while loading")
    ]
    assert r.life.state is State.LOADING


def test_a_load_of_a_restarting_model_is_refused() -> None:
    r = run(on_demand())
    r.step(LoadRequested(ROLE))
    r.step(Launched(ROLE, None, "port 8501 is taken"))
    assert r.step(LoadRequested(ROLE)) == [
        Answer(False, "restarting", "cannot load while restarting")
    ]


# -- footprints ----------------------------------------------------------------------------


def test_the_footprint_measured_when_ready_is_remembered() -> None:
    r = run().starting()
    actions = r.step(HealthProbed(ROLE, True, resident_mb=700))
    assert actions[0] == Remember(ROLE, 700)
    assert r.life.measured_mb == 700
    r2 = run().starting()
    assert not any(isinstance(a, Remember) for a in r2.step(HealthProbed(ROLE, True)))


def test_a_measure_with_nothing_known_becomes_the_footprint() -> None:
    r = run(lifecycle(measured_mb=None)).serving()
    assert r.step(Measured(ROLE, 300)) == [Remember(ROLE, 300)]
    assert (r.life.measured_mb, r.life.resident_mb) == (300, 300)


@pytest.mark.parametrize(
    ("resident", "measured", "event"),
    [
        (150, 200, False),  # below what it measured at ready
        (1200, 200, False),  # its prompt cache filled: exactly the admitted footprint
        (1201, 201, False),  # beyond it: the measured part rises to cover it
        (1260, 260, False),  # by 5 %: still no event
        (1261, 261, True),  # by more than 5 %: memory_grew, remembered
    ],
)
def test_growth_beyond_the_admitted_footprint_raises_it_and_past_5_percent_is_an_event(
    resident: int, measured: int, event: bool
) -> None:
    """Measured 200 MiB at ready, admitted with a 1000 MiB prompt cache: 1200 MiB."""
    r = run(lifecycle(measured_mb=200)).serving()
    actions = r.step(Measured(ROLE, resident, admitted_mb=1200, prompt_cache_mb=1000))
    grew = [
        Emit(
            "memory_grew",
            {
                **r.life.ids(),
                "resident_mb": resident,
                "admitted_mb": 1200,
                "prompt_cache_mb": 1000,
            },
        ),
        Remember(ROLE, measured),
    ]
    assert actions == (grew if event else [])
    assert (r.life.measured_mb, r.life.resident_mb) == (measured, resident)


def test_growth_is_reported_again_only_past_5_percent_of_the_last_report() -> None:
    """With ``memory_mb`` the admitted footprint never rises: the last report is the
    mark the next must pass, so a steady excess is one event, not one per sweep."""
    r = run(lifecycle(measured_mb=200)).serving()

    def grew(resident: int) -> bool:
        actions = r.step(Measured(ROLE, resident, admitted_mb=500, prompt_cache_mb=0))
        return any(isinstance(a, Emit) and a.event == "memory_grew" for a in actions)

    assert grew(600)
    assert not grew(600)
    assert not grew(630)
    assert grew(631)


def test_an_unbounded_prompt_cache_counts_nothing_off_the_measure() -> None:
    r = run(lifecycle(measured_mb=200)).serving()
    r.step(Measured(ROLE, 400, admitted_mb=200, prompt_cache_mb=None))
    assert r.life.measured_mb == 400


@pytest.mark.parametrize("setup", [_launching, _restarting_dead, _at_restarting_stop, _failed])
def test_a_measure_of_a_backend_not_serving_is_ignored(setup: Callable[[Run], None]) -> None:
    r = run()
    setup(r)
    known = r.life.measured_mb
    assert r.step(Measured(ROLE, 999)) == []
    assert r.life.measured_mb == known


# -- a backend a reload adds in place of one still draining ------------------------------


def test_a_replacing_backend_is_held_until_the_old_process_is_gone() -> None:
    r = run(lifecycle(held_by=OLD, reloaded=True))
    assert r.step(Begin()) == []  # nothing launches while the old process drains
    assert isinstance(phase(r.life), Held) and r.life.state is State.STARTING
    assert r.life.reason is not None and str(OLD) in r.life.reason
    assert r.step(Tick(), 5.0) == []  # no probe: there is no process of its own
    assert r.step(Released(ROLE)) == [Launch(ROLE)]
    assert isinstance(phase(r.life), Launching)
    r.step(Launched(ROLE, NEW))
    assert r.life.reloaded  # requests still wait for it
    r.step(HealthProbed(ROLE, True), 1.0)
    assert isinstance(phase(r.life), Ready) and not r.life.reloaded
    assert r.life.restarts == 0 and r.life.budget.used == 0


def test_a_replacing_on_demand_backend_is_unloaded_once_released() -> None:
    r = run(lifecycle(held_by=OLD, on_demand=True))
    r.step(Begin())
    assert r.life.state is State.UNLOADING  # the old process still holds its memory
    assert r.step(Load(ROLE)) == []  # not loadable until then
    assert r.step(Released(ROLE)) == []
    assert isinstance(phase(r.life), Unloaded)
    assert r.step(Load(ROLE))[-1] == Launch(ROLE)


def test_released_means_nothing_outside_held() -> None:
    r = run()
    r.ready()
    assert r.step(Released(ROLE)) == []
    assert isinstance(phase(r.life), Ready)


def test_a_held_backend_is_stopped_at_shutdown_and_restart_requests_find_no_process() -> None:
    r = run(lifecycle(held_by=OLD))
    r.step(Begin())
    actions = r.step(r.request())
    assert events(actions) == ["backend_not_running"]
    r.step(Shutdown())
    assert r.life.state is State.STOPPED
