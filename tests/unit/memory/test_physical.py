"""Physical memory and the default budget."""

from __future__ import annotations

import os

import psutil
import pytest

from slm_server.memory.physical import (
    FLOOR_MB,
    RESERVE_MB,
    default_budget_mb,
    physical_memory_mb,
)


def test_physical_memory_agrees_with_psutil() -> None:
    total = physical_memory_mb()
    assert total == psutil.virtual_memory().total >> 20


def test_physical_memory_falls_back_to_psutil(monkeypatch: pytest.MonkeyPatch) -> None:
    def unsupported(name: str) -> int:
        raise ValueError(name)

    monkeypatch.setattr(os, "sysconf", unsupported)
    assert physical_memory_mb() == psutil.virtual_memory().total >> 20


@pytest.mark.parametrize(
    ("total", "budget"),
    [
        (65536, 49152),  # 3/4 of 64 GiB
        (16384, 12288),  # 3/4 of 16 GiB: leaves more than the reserve
        (6144, 4096),  # 8 GiB less than... the 2 GiB reserve binds
        (2048, FLOOR_MB),  # nothing left after the reserve: the floor
        (400, 400),  # the floor never exceeds the machine
    ],
)
def test_default_budget(total: int, budget: int) -> None:
    assert default_budget_mb(total) == budget


def test_the_budget_leaves_the_reserve_above_the_floor() -> None:
    for total in range(FLOOR_MB + RESERVE_MB, 200_000, 997):
        assert total - default_budget_mb(total) >= min(RESERVE_MB, total - FLOOR_MB)


def test_default_budget_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="positive"):
        default_budget_mb(0)
