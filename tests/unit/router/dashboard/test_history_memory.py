"""The history's memory, measured: an hour of samples at the default interval for 20
models, with a full ring of events, stays within 5 MiB (the figure in
docs/dashboard.md comes from ``python -m benchmarks.history_memory``)."""

from __future__ import annotations

import pytest

from benchmarks.history_memory import measure, reachable_bytes
from slm_server.router.dashboard.history import MAX_EVENTS, SERIES
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
