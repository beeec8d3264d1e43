"""The backend lifecycle's transition table."""

from __future__ import annotations

import itertools

import pytest

from slm_server.contracts.states import (
    FINAL,
    RUNNING,
    SUPERVISED,
    TRANSITIONS,
    State,
    TransitionError,
    check_transition,
)

S = State
ALLOWED: set[tuple[State, State]] = {
    (S.STARTING, S.READY),
    (S.STARTING, S.RESTARTING),
    (S.STARTING, S.ABANDONED),
    (S.STARTING, S.FAILED),
    (S.STARTING, S.STOPPED),
    (S.READY, S.RESTARTING),
    (S.READY, S.ABANDONED),
    (S.READY, S.FAILED),
    (S.READY, S.STOPPED),
    (S.RESTARTING, S.STARTING),
    (S.RESTARTING, S.RESTARTING),
    (S.RESTARTING, S.ABANDONED),
    (S.RESTARTING, S.FAILED),
    (S.RESTARTING, S.STOPPED),
    (S.ABANDONED, S.STOPPED),
    (S.FAILED, S.STOPPED),
    # stopping twice is a no-op rather than a bug
    (S.STOPPED, S.STOPPED),
    # load: on_demand
    (S.UNLOADED, S.LOADING),
    (S.UNLOADED, S.STOPPED),
    (S.LOADING, S.READY),
    (S.LOADING, S.RESTARTING),
    (S.LOADING, S.ABANDONED),
    (S.LOADING, S.FAILED),
    (S.LOADING, S.STOPPED),
    (S.LOADING, S.UNLOADING),
    (S.READY, S.UNLOADING),
    (S.UNLOADING, S.UNLOADED),
    (S.UNLOADING, S.STOPPED),
}
ALL_PAIRS = list(itertools.product(State, State))
ALLOWED_PAIRS = [pair for pair in ALL_PAIRS if pair in ALLOWED]
FORBIDDEN = [pair for pair in ALL_PAIRS if pair not in ALLOWED]
RUNNING_STATES = [s for s in State if s in RUNNING]


def name(pair: tuple[State, State]) -> str:
    return f"{pair[0].value}->{pair[1].value}"


def test_the_expected_table_is_the_implemented_one() -> None:
    implemented = {(a, b) for a, targets in TRANSITIONS.items() for b in targets}
    assert implemented | {(S.STOPPED, S.STOPPED)} == ALLOWED
    assert set(TRANSITIONS) == set(State)


@pytest.mark.parametrize("pair", ALLOWED_PAIRS, ids=name)
def test_allowed_transitions(pair: tuple[State, State]) -> None:
    current, target = pair
    assert check_transition(current, target) is target


@pytest.mark.parametrize("pair", FORBIDDEN, ids=name)
def test_forbidden_transitions(pair: tuple[State, State]) -> None:
    current, target = pair
    with pytest.raises(TransitionError) as caught:
        check_transition(current, target)
    assert str(caught.value) == f"{current.value} -> {target.value} is not a valid transition"


def test_counts() -> None:
    assert len(ALLOWED_PAIRS) == len(ALLOWED) == 28
    assert len(ALLOWED) + len(FORBIDDEN) == len(State) ** 2 == 100
    assert len(FORBIDDEN) == 72


@pytest.mark.parametrize("state", RUNNING_STATES)
def test_every_running_state_can_stop(state: State) -> None:
    assert check_transition(state, S.STOPPED) is S.STOPPED


@pytest.mark.parametrize("state", [S.STOPPED, S.DISABLED])
def test_terminal_states_go_nowhere_else(state: State) -> None:
    for target in State:
        if (state, target) in ALLOWED:
            continue
        with pytest.raises(TransitionError):
            check_transition(state, target)


def test_disabled_is_never_started_nor_stopped() -> None:
    assert TRANSITIONS[S.DISABLED] == frozenset()
    with pytest.raises(TransitionError):
        check_transition(S.DISABLED, S.STARTING)
    with pytest.raises(TransitionError):
        check_transition(S.DISABLED, S.DISABLED)


def test_nothing_enters_disabled() -> None:
    for state in State:
        assert S.DISABLED not in TRANSITIONS[state]


def test_ready_is_reached_only_from_starting_or_loading() -> None:
    assert [s for s in State if S.READY in TRANSITIONS[s]] == [S.STARTING, S.LOADING]


def test_unloaded_is_reached_only_through_unloading() -> None:
    assert [s for s in State if S.UNLOADED in TRANSITIONS[s]] == [S.UNLOADING]
    assert [s for s in State if S.LOADING in TRANSITIONS[s]] == [S.UNLOADED]


def test_starting_is_reached_only_from_restarting() -> None:
    assert [s for s in State if S.STARTING in TRANSITIONS[s]] == [S.RESTARTING]


def test_running_and_final_groupings() -> None:
    running = {S.STARTING, S.LOADING, S.READY, S.RESTARTING, S.UNLOADING}
    assert frozenset(running) == RUNNING
    assert frozenset({S.ABANDONED, S.FAILED, S.STOPPED, S.DISABLED}) == FINAL
    assert RUNNING.isdisjoint(FINAL)
    assert frozenset(State) == RUNNING | FINAL | {S.UNLOADED}
    assert RUNNING | {S.UNLOADED} == SUPERVISED


def test_final_states_never_return_to_running() -> None:
    for state in FINAL:
        assert TRANSITIONS[state].isdisjoint(RUNNING)


def test_transition_error_is_a_runtime_error() -> None:
    assert issubclass(TransitionError, RuntimeError)


def test_state_values() -> None:
    assert [s.value for s in State] == [
        "starting",
        "ready",
        "restarting",
        "abandoned",
        "failed",
        "stopped",
        "disabled",
        "unloaded",
        "loading",
        "unloading",
    ]
