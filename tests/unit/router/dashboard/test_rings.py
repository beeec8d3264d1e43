"""A ring keeps the last values of one series by tick: it grows to its capacity, then
overwrites its oldest value, answers "missing" outside what it holds, and a series
that began late answers "missing" before its start."""

from __future__ import annotations

import math

import pytest

from slm_server.router.dashboard.rings import MISSING_STATE, Ring


def test_a_ring_grows_to_its_capacity_and_then_keeps_the_last_values() -> None:
    ring = Ring("d", 4)
    for tick in range(3):
        ring.put(tick, float(tick))
    assert ring.span(0, 3) == [0.0, 1.0, 2.0]
    for tick in range(3, 11):
        ring.put(tick, float(tick))
    assert len(ring.values) == 4  # never more than its capacity
    assert ring.oldest == 7
    assert ring.span(7, 11) == [7.0, 8.0, 9.0, 10.0]
    # Every window across the wrap-around reads in tick order.
    for start in range(7, 11):
        for stop in range(start, 12):
            expected = [float(t) if t < 11 else math.nan for t in range(start, stop)]
            got = ring.span(start, stop)
            assert len(got) == len(expected)
            assert all(
                a == b or (math.isnan(a) and math.isnan(b))
                for a, b in zip(got, expected, strict=True)
            )


def test_ticks_outside_what_is_held_are_missing() -> None:
    ring = Ring("f", 3)
    for tick in range(5):
        ring.put(tick, tick * 1.5)
    got = ring.span(0, 6)
    assert [math.isnan(v) for v in got] == [True, True, False, False, False, True]
    assert got[2:5] == [3.0, 4.5, 6.0]
    assert ring.span(4, 4) == []


def test_a_series_that_began_late_is_missing_before_it() -> None:
    ring = Ring("b", 5, first=3)
    ring.put(3, 2)
    ring.put(4, 7)
    assert ring.span(1, 5) == [MISSING_STATE, MISSING_STATE, 2, 7]
    for tick in range(5, 12):
        ring.put(tick, tick)
    assert ring.span(6, 12) == [MISSING_STATE, 7, 8, 9, 10, 11]


def test_skipped_ticks_are_missing_and_ticks_never_go_back() -> None:
    ring = Ring("b", 4)
    ring.put(0, 1)
    ring.put(2, 3)
    assert ring.span(0, 3) == [1, MISSING_STATE, 3]
    with pytest.raises(ValueError, match="tick 1 comes before 3"):
        ring.put(1, 5)
    with pytest.raises(ValueError, match="at least one value"):
        Ring("d", 0)
