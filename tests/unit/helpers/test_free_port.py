"""The tests' free ports: two calls never give the same port (two registry entries
built from two calls once shared one, when the kernel gave the same ephemeral port to
two binds in a row)."""

from __future__ import annotations

import socket

import pytest

from tests.fakes import control
from tests.processes import free_port


def test_many_calls_give_distinct_ports() -> None:
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)


def test_a_port_the_kernel_repeats_is_not_handed_out_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = free_port()
    answers = iter([first, first, 0])
    real_bind = socket.socket.bind

    def bind(self: socket.socket, address: tuple[str, int]) -> None:
        real_bind(self, (address[0], next(answers)))

    # The kernel "returns" the port already handed out, twice; then any free one.
    monkeypatch.setattr(socket.socket, "bind", bind)
    assert control.free_port() != first
