"""The history's memory, measured: an hour of samples at the default interval for 20
models, with a full ring of events, stays within 5 MiB, and so does a full ring of
events from a forged log at its worst (the figures in docs/dashboard.md come from
``python -m benchmarks.history_memory``)."""

from __future__ import annotations

import pytest

from benchmarks.history_memory import WIDTHS, forged_events_bytes, measure, reachable_bytes
from slm_server.router.dashboard.history import MAX_EVENTS, SERIES
from slm_server.router.dashboard.timeline import MAX_NAME_CHARS, MAX_REASON_CHARS
from slm_server.settings import HistorySettings

LIMIT_BYTES = 5 * 1024 * 1024


def test_an_hour_of_samples_for_20_models_stays_within_5_mib() -> None:
    defaults = HistorySettings()
    found = measure(models=20, seconds=defaults.keep_seconds, interval=defaults.interval_seconds)
    assert found.samples == defaults.samples == 720
    assert found.events == MAX_EVENTS
    assert found.traced_bytes <= LIMIT_BYTES
    assert found.walked_bytes <= LIMIT_BYTES
    # What the samples must take at least, stored as 8-byte numbers: a measurement
    # that saw less would not be measuring them.
    assert found.walked_bytes >= 20 * len(SERIES) * 720 * 8


def test_the_measurement_sees_memory_that_a_history_holds() -> None:
    """The walk counts what is reachable (a history kept as Python lists of floats
    would be over the limit), and more models cost more."""
    as_lists = {name: [float(i) + 0.5 for i in range(720)] for name in range(20 * len(SERIES))}
    assert reachable_bytes(as_lists) > LIMIT_BYTES
    small, large = measure(2, seconds=600, events=0), measure(8, seconds=600, events=0)
    assert large.walked_bytes > small.walked_bytes
    assert large.traced_bytes > small.traced_bytes
    assert small.walked_bytes == pytest.approx(small.traced_bytes, rel=0.25)


@pytest.mark.parametrize("char", WIDTHS)
def test_a_full_ring_of_forged_events_at_their_worst_stays_within_5_mib(char: str) -> None:
    """Every event of a forged log distinct, read in a turn of its own, its names and
    reason as long as kept, in characters stored 1, 2 or 4 bytes wide."""
    found = forged_events_bytes(char)
    assert found <= LIMIT_BYTES
    # What the kept characters take at least: a walk that saw less missed them.
    assert found >= MAX_EVENTS * (2 * MAX_NAME_CHARS + MAX_REASON_CHARS)
