"""The tests' free ports: two calls never give the same port (two registry entries
built from two calls once shared one, when the kernel gave the same ephemeral port to
two binds in a row), a port someone holds is never handed out, and two pytest-xdist
workers never hand out the same one."""

from __future__ import annotations

import socket

import pytest

from tests.fakes import control
from tests.processes import free_port


def test_many_calls_give_distinct_ports() -> None:
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)


def test_a_port_someone_holds_is_not_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)  # every port is this test's
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", free_port()))
        held.listen()
        taken = held.getsockname()[1]
        control._HANDED_OUT.discard(taken)
        draws = iter(
            [taken, taken, taken + 1 if taken + 1 not in control._HANDED_OUT else taken + 2]
        )
        monkeypatch.setattr(control._RANDOM, "randrange", lambda start, stop: next(draws))
        assert control.free_port() != taken


def test_ports_come_from_below_the_ephemeral_range() -> None:
    pool = control._listening_pool()
    assert all(pool.start <= port < pool.stop for port in (free_port() for _ in range(50)))


def test_each_xdist_worker_draws_only_its_share(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "3")
    assert {free_port() % 3 for _ in range(50)} == {1}


def test_runs_of_ports_are_consecutive_free_and_apart_from_single_ports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An entry with three replicas takes its port and the next two. The run comes from
    this worker's own part of the numbers below the ephemeral range (it was drawn from
    the ephemeral range, where an outgoing connection once took the middle port before
    the replica could bind it), and never overlaps a single port or another run."""
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw2")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "4")
    share = control._runs_share(2, 4)
    pool = control._listening_pool()
    assert pool.start <= share.start and share.stop <= pool.stop
    assert not set(share) & set(control._runs_share(1, 4))
    runs = [control.free_ports(3) for _ in range(20)]
    taken = [port for base in runs for port in range(base, base + 3)]
    assert len(set(taken)) == len(taken)
    assert all(share.start <= port < share.stop for port in taken)
    singles = {free_port() for _ in range(50)}
    assert not singles & set(taken)
    assert all(port < pool.stop - control.RUNS_REGION for port in singles)


def test_a_run_with_a_held_port_is_not_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    share = control._runs_share(0, 1)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        middle = next(
            p
            for p in range(share.start + 1, share.stop - 3)
            if all(
                control._bindable(q) and q not in control._HANDED_OUT for q in range(p - 1, p + 4)
            )
        )
        held.bind(("127.0.0.1", middle))
        held.listen()
        draws = iter([middle - 1, middle - 1, middle + 1])
        monkeypatch.setattr(control._RANDOM, "randrange", lambda start, stop: next(draws))
        base = control.free_ports(3)
    assert middle not in range(base, base + 3)
