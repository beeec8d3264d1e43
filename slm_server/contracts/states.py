"""A backend's lifecycle states and the transitions allowed between them. Pure.

    STARTING ──ready──▶ READY ──exit / trip──▶ RESTARTING ──spawned──▶ STARTING
        │                 │                        │
        └─exit─▶ RESTARTING                        └─budget spent──▶ ABANDONED
    any running state ──shutdown──▶ STOPPED
    FAILED: could not run and will not be retried (watchdog off, or a registry error)
    DISABLED: ``enabled: false`` in the registry; never started

A ``load: on_demand`` model starts UNLOADED and goes through LOADING instead of
STARTING; the router's unload takes it back::

    UNLOADED ──load──▶ LOADING ──ready──▶ READY ──unload──▶ UNLOADING ──stopped──▶ UNLOADED
                          │ exit / failed launch                ▲
                          └──▶ RESTARTING (a failed load, like a failed start)
    LOADING (spawned) ──unload──────────────────────────────────┘

DEGRADED is not a supervisor state: the router reports it for a READY backend whose
failure streak is open.
"""

from __future__ import annotations

import enum


class State(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    RESTARTING = "restarting"
    ABANDONED = "abandoned"
    FAILED = "failed"
    STOPPED = "stopped"
    DISABLED = "disabled"
    UNLOADED = "unloaded"
    LOADING = "loading"
    UNLOADING = "unloading"


RUNNING = frozenset({State.STARTING, State.LOADING, State.READY, State.RESTARTING, State.UNLOADING})
# Supervised (the supervisor goes on while any backend is in one of these).
SUPERVISED = RUNNING | {State.UNLOADED}
FINAL = frozenset({State.ABANDONED, State.FAILED, State.STOPPED, State.DISABLED})

TRANSITIONS: dict[State, frozenset[State]] = {
    # UNLOADED -> LOADING on the router's load command.
    State.UNLOADED: frozenset({State.LOADING, State.STOPPED}),
    # LOADING is STARTING for a load on demand; it may also be unloaded.
    State.LOADING: frozenset(
        {
            State.READY,
            State.RESTARTING,
            State.ABANDONED,
            State.FAILED,
            State.STOPPED,
            State.UNLOADING,
        }
    ),
    # UNLOADING -> UNLOADED once the process is gone.
    State.UNLOADING: frozenset({State.UNLOADED, State.STOPPED}),
    # STARTING -> READY when /health answers 200 and the process lives;
    # STARTING -> RESTARTING when it exits first (or a launch fails);
    # STARTING -> ABANDONED/FAILED when it may not be retried.
    State.STARTING: frozenset(
        {State.READY, State.RESTARTING, State.ABANDONED, State.FAILED, State.STOPPED}
    ),
    # READY -> RESTARTING on an exit or an accepted restart request; -> UNLOADING on
    # the router's unload (load: on_demand only).
    State.READY: frozenset(
        {State.RESTARTING, State.ABANDONED, State.FAILED, State.STOPPED, State.UNLOADING}
    ),
    # RESTARTING -> STARTING once relaunched; -> ABANDONED when the budget is spent.
    State.RESTARTING: frozenset(
        {State.STARTING, State.RESTARTING, State.ABANDONED, State.FAILED, State.STOPPED}
    ),
    State.ABANDONED: frozenset({State.STOPPED}),
    State.FAILED: frozenset({State.STOPPED}),
    State.STOPPED: frozenset(),
    State.DISABLED: frozenset(),
}


class TransitionError(RuntimeError):
    """A transition the table does not allow: a bug in the supervisor."""


def check_transition(current: State, target: State) -> State:
    """``target`` if the table allows ``current -> target``; raises otherwise."""
    if target is current and current is State.STOPPED:
        return target
    if target not in TRANSITIONS[current]:
        raise TransitionError(f"{current.value} -> {target.value} is not a valid transition")
    return target
