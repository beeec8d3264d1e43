"""What the supervisor is doing with a backend: one phase per backend, with the data
that only means something in that phase (no flags beside the state). Each phase maps to
one published :class:`~slm_server.contracts.states.State`. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from slm_server.contracts.states import State


@dataclass(frozen=True)
class Attempt:
    """A restart in progress: its number in the budget window, the pid it replaces, why."""

    number: int
    old_pid: int | None
    reason: str


@dataclass(frozen=True)
class Launching:
    """A launch (plan, free the port, spawn) is under way: the first (``attempt`` None,
    published as STARTING, or LOADING for a ``load`` on demand) or a restart's
    (published as RESTARTING until it spawned)."""

    attempt: Attempt | None = None
    load: bool = False

    @property
    def state(self) -> State:
        if self.attempt is not None:
            return State.RESTARTING
        return State.LOADING if self.load else State.STARTING


@dataclass(frozen=True)
class Starting:
    """Spawned at ``since`` (monotonic), waiting for ``/health``; ``loading_reported``
    once the slow-load warning went out."""

    since: float
    attempt: Attempt | None = None
    loading_reported: bool = False
    load: bool = False  # loaded on demand: LOADING, and a failure is a failed load

    @property
    def state(self) -> State:
        return State.LOADING if self.load and self.attempt is None else State.STARTING


@dataclass(frozen=True)
class Ready:
    """Serving: ``/health`` answered 200 and the process lives."""

    @property
    def state(self) -> State:
        return State.READY


@dataclass(frozen=True)
class Confirming:
    """A trip (``reason``) is being checked against the backend itself before acting."""

    reason: str
    detail: str | None = None

    @property
    def state(self) -> State:
        return State.READY


@dataclass(frozen=True)
class Restarting:
    """Waiting to relaunch for ``reason``: for the budget's cooldown, or (``stopping``)
    for the old process to be gone. ``spawned_nothing``: the last attempt started no
    process, so there is nothing to cool down after."""

    reason: str
    spawned_nothing: bool = False
    stopping: Attempt | None = None

    @property
    def state(self) -> State:
        return State.RESTARTING


@dataclass(frozen=True)
class Unloaded:
    """A ``load: on_demand`` model with no process: not a failure, waiting to be loaded."""

    @property
    def state(self) -> State:
        return State.UNLOADED


@dataclass(frozen=True)
class Unloading:
    """The router asked for the process to go (``reason``: ``idle_ttl``, ``evicted``
    to make room for ``for_model``, ``api``, or ``no_waiter``); stopping it."""

    reason: str
    for_model: str | None = None

    @property
    def state(self) -> State:
        return State.UNLOADING


@dataclass(frozen=True)
class Held:
    """Added by a reload in place of a process that is still draining (``pid``, the
    entry's old launch): nothing starts until that process is gone. Published as
    STARTING, or for a ``load: on_demand`` model as UNLOADING (its memory is still
    held, then it is unloaded)."""

    pid: int
    load: bool = False

    @property
    def state(self) -> State:
        return State.UNLOADING if self.load else State.STARTING


@dataclass(frozen=True)
class Done:
    """A final state (ABANDONED, FAILED, STOPPED, DISABLED) and why."""

    final: State

    @property
    def state(self) -> State:
        return self.final


Phase = Launching | Starting | Ready | Confirming | Restarting | Unloaded | Unloading | Held | Done
