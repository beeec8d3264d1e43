"""One transfer's rate, time left and stall, on a fake clock."""

from __future__ import annotations

import pytest

from slm_server.pull.meter import Meter


def test_rate_and_time_left_follow_the_last_seconds() -> None:
    meter = Meter(total=1000, started=0.0)
    for second in range(1, 6):
        meter.advance(100, float(second))
    assert meter.bytes_per_second(5.0) == pytest.approx(100.0)
    assert meter.seconds_left(5.0) == pytest.approx(5.0)
    for second in range(6, 11):
        meter.advance(20, float(second))
    assert meter.bytes_per_second(10.0) == pytest.approx(20.0)


def test_a_resumed_transfer_counts_from_what_was_there() -> None:
    meter = Meter(total=1000, started=0.0, resumed=600)
    meter.advance(100, 1.0)
    assert meter.done == 700
    assert meter.bytes_per_second(1.0) == pytest.approx(100.0)
    assert meter.seconds_left(1.0) == pytest.approx(3.0)


def test_no_rate_before_time_passes() -> None:
    meter = Meter(total=None, started=3.0)
    assert meter.bytes_per_second(3.0) is None
    assert meter.seconds_left(4.0) is None


def test_a_trickle_is_a_stall_and_a_steady_download_is_not() -> None:
    trickle = Meter(total=10**6, started=0.0, stall_seconds=10.0, min_bytes_per_second=1024)
    steady = Meter(total=10**9, started=0.0, stall_seconds=10.0, min_bytes_per_second=1024)
    for tick in range(1, 121):
        now = tick / 4
        trickle.advance(1, now)
        steady.advance(10_000, now)
        if now < 10.0:
            assert not trickle.stalled(now)
        assert not steady.stalled(now)
    assert trickle.stalled(30.0)


def test_a_fast_start_then_silence_is_a_stall_once_the_window_passes() -> None:
    meter = Meter(total=10**9, started=0.0, stall_seconds=5.0, min_bytes_per_second=100)
    meter.advance(10**6, 1.0)
    assert not meter.stalled(5.5)
    meter.advance(1, 11.0)
    assert meter.stalled(11.0)


def test_memory_stays_bounded_over_a_long_transfer() -> None:
    meter = Meter(total=None, started=0.0, stall_seconds=2.0)
    for tick in range(100_000):
        meter.advance(1, tick / 1000)
    assert len(meter._marks) <= 5_100
