"""A transfer's reports, stall and cancel, on a fake clock."""

from __future__ import annotations

import threading

import pytest

from slm_server.pull.errors import PullError
from slm_server.pull.events import Event, Progress
from slm_server.pull.transfer import Transfer
from slm_server.settings import PullSettings


def make(now: list[float], cancel: threading.Event | None = None) -> tuple[Transfer, list[Event]]:
    seen: list[Event] = []
    settings = PullSettings(stall_seconds=2.0, min_bytes_per_second=100)
    return Transfer("f", 10_000, 0, settings, seen.append, cancel, lambda: now[0]), seen


def test_reports_are_spaced_and_the_last_one_is_whole() -> None:
    now = [0.0]
    transfer, seen = make(now)
    for _ in range(100):
        now[0] += 0.01
        transfer.advance(100)
    transfer.finish()
    progress = [e for e in seen if isinstance(e, Progress)]
    assert 5 <= len(progress) <= 8
    assert progress[-1].done == 10_000


def test_a_trickle_stops_the_transfer() -> None:
    now = [0.0]
    transfer, _ = make(now)
    stopped: PullError | None = None
    for _ in range(100):
        now[0] += 0.5
        try:
            transfer.advance(1)
        except PullError as exc:
            stopped = exc
            break
    assert stopped is not None and stopped.kind == "stalled"
    assert now[0] <= 3.0


def test_a_cancel_stops_the_transfer_at_its_next_chunk() -> None:
    now = [0.0]
    cancel = threading.Event()
    transfer, _ = make(now, cancel)
    transfer.advance(10)
    cancel.set()
    with pytest.raises(PullError) as raised:
        transfer.advance(10)
    assert raised.value.kind == "cancelled"


def test_bytes_seen_twice_are_counted_once_whichever_source_is_ahead() -> None:
    now = [0.0]
    transfer, seen = make(now)
    for _ in range(10):  # an HTTP download: the network first, the downloader later
        now[0] += 0.3
        transfer.advance_from_network(100)
    transfer.advance(1000)
    assert transfer.meter.done == 1000
    transfer.advance_from_network(50)  # a small request of another client's (Xet's token)
    for _ in range(5):
        now[0] += 0.3
        transfer.advance(1000)  # ... while it reports its own progress
    assert transfer.meter.done == 6000
    assert [e.done for e in seen if isinstance(e, Progress)][-1] == 6000
