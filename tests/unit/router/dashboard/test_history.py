"""The history's pure core, driven by hand-made snapshots on a fake clock: rates and
quantiles over each interval from the running totals' differences, the outcome
groups, tokens from the cache and computed, nulls where there is no data, the rings'
wrap-around, ``since``, models and backends that come and go, and the events ring."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from slm_server.router.dashboard.history import (
    GROUPS,
    MACHINE,
    MAX_ANSWER_SAMPLES,
    SERIES,
    BackendReading,
    Buckets,
    History,
    ModelReading,
    Snapshot,
    quantile,
)
from slm_server.router.dashboard.timeline import Event
from slm_server.router.observe.metrics import OUTCOMES

BUCKETS = Buckets(ttft=(0.1, 0.5, 1.0), tokens_per_second=(10.0, 50.0), admission_wait=(1.0,))
EPOCH = 1_765_000_000.0
ZERO4, ZERO3, ZERO2 = (0, 0, 0, 0), (0, 0, 0), (0, 0)


def reading(
    requests: Mapping[str, float] | None = None,
    *,
    ttft: Sequence[int] = ZERO4,
    tps: Sequence[int] = ZERO3,
    wait: Sequence[int] = ZERO2,
    prompt: float = 0.0,
    cached: float = 0.0,
    in_flight: int | None = 0,
    queued: int | None = 0,
    memory: float | None = 0.0,
) -> ModelReading:
    return ModelReading(
        requests=requests or {},
        ttft=ttft,
        tokens_per_second=tps,
        admission_wait=wait,
        prompt_tokens=prompt,
        cached_tokens=cached,
        in_flight=in_flight,
        queued=queued,
        memory_mb=memory,
    )


def snap(
    seconds: float,
    models: Mapping[str, ModelReading] | None = None,
    backends: Mapping[str, BackendReading] | None = None,
    machine: Mapping[str, float | None] | None = None,
) -> Snapshot:
    """The router ``seconds`` after the fake clock's start."""
    return Snapshot(
        wall=EPOCH + seconds,
        clock=100.0 + seconds,
        machine=machine or {},
        models=models or {},
        backends=backends or {},
    )


def series(answer: dict[str, Any], model: str) -> dict[str, list[float | None]]:
    found: dict[str, list[float | None]] = next(
        m["series"] for m in answer["models"] if m["model"] == model
    )
    return found


def test_the_outcome_groups_cover_every_outcome_once() -> None:
    grouped = [outcome for outcomes in GROUPS.values() for outcome in outcomes]
    assert sorted(grouped) == sorted(OUTCOMES)
    assert list(GROUPS) == ["ok", "client_error", "backend_error", "cut"]


def test_rates_are_per_second_over_the_interval_and_grouped_by_outcome() -> None:
    history = History(10, BUCKETS)
    history.record(snap(0, {"m": reading({"ok": 3, "rejected": 1})}))
    later = {
        "ok": 13,
        "rejected": 3,
        "client_error": 2,
        "backend_error": 1,
        "timeout": 1,
        "unavailable": 1,
        "router_error": 2,
        "cancelled": 4,
        "stream_error": 1,
    }
    history.record(snap(5, {"m": reading(later)}))
    got = series(history.answer(), "m")
    assert got["requests_ok"] == [None, 2.0]  # 10 in 5 s
    assert got["requests_client_error"] == [None, 0.8]  # 2 more rejected + 2 client errors
    assert got["requests_backend_error"] == [None, 1.0]  # 1 + 1 + 1 + 2
    assert got["requests_cut"] == [None, 1.0]  # 4 + 1


def test_quantiles_come_from_the_intervals_bucket_differences() -> None:
    history = History(10, BUCKETS)
    history.record(snap(0, {"m": reading(ttft=(50, 0, 0, 0))}))  # fast ones, before
    history.record(snap(5, {"m": reading(ttft=(50, 4, 0, 0))}))  # 4 in (0.1, 0.5]
    history.record(snap(10, {"m": reading(ttft=(50, 4, 0, 0))}))  # none
    got = series(history.answer(), "m")
    # Within (0.1, 0.5]: p50 at rank 2 of 4, p95 at rank 3.8 of 4. From the totals
    # (54 observations) both would fall in the first bucket.
    assert got["ttft_p50"] == [None, pytest.approx(0.3), None]
    assert got["ttft_p95"] == [None, pytest.approx(0.48), None]
    assert got["tokens_per_second_p50"] == [None, None, None]


@pytest.mark.parametrize(
    ("q", "counts", "expected"),
    [
        (0.5, (1, 1, 2, 0), 2.0),  # the rank falls on the second bucket's top
        (0.95, (1, 1, 2, 0), 3.8),
        (0.5, (4, 0, 0, 0), 0.5),  # the first bucket starts at 0
        (0.5, (0, 0, 0, 3), 4.0),  # in +Inf: the highest finite bound
        (0.95, (0, 2, 0, 0), 1.95),
        (0.5, (0, 0, 0, 0), None),
    ],
)
def test_quantile_interpolates_as_histogram_quantile(
    q: float, counts: tuple[int, ...], expected: float | None
) -> None:
    found = quantile(q, (1.0, 2.0, 4.0), counts)
    assert found == (None if expected is None else pytest.approx(expected))


def test_tokens_read_from_the_cache_and_computed_in_each_interval() -> None:
    history = History(10, BUCKETS)
    history.record(snap(0, {"m": reading(prompt=1000, cached=200)}))
    history.record(snap(5, {"m": reading(prompt=1100, cached=260)}))
    got = series(history.answer(), "m")
    assert got["prompt_tokens_cached"] == [None, 60.0]
    assert got["prompt_tokens_computed"] == [None, 40.0]


def test_gauges_are_as_sampled_and_nulls_stand_where_nothing_is_known() -> None:
    history = History(10, BUCKETS)
    machine = {"free_mb": 9000.0, "floor_mb": 1024.0, "budget_mb": 16000.0, "held_mb": 700.0}
    history.record(snap(0, {"m": reading(in_flight=2, queued=1, memory=700.0)}, machine=machine))
    history.record(snap(5, {"m": reading(in_flight=None, queued=None, memory=None)}))
    answer = history.answer()
    got = series(answer, "m")
    assert got["in_flight"] == [2.0, None]
    assert got["queued"] == [1.0, None]
    assert got["memory_mb"] == [700.0, None]
    assert answer["machine"] == {name: [machine[name], None] for name in MACHINE}
    assert list(got) == list(SERIES)


def test_a_total_that_went_down_counts_from_zero() -> None:
    history = History(10, BUCKETS)
    history.record(snap(0, {"m": reading({"ok": 50}, ttft=(9, 9, 0, 0), prompt=500)}))
    history.record(snap(2, {"m": reading({"ok": 4}, ttft=(0, 2, 0, 0), prompt=100)}))
    got = series(history.answer(), "m")
    assert got["requests_ok"] == [None, 0.0]  # never negative
    assert got["ttft_p50"] == [None, pytest.approx(0.3)]  # the 2 counted afresh
    assert got["prompt_tokens_computed"] == [None, 0.0]


def test_the_rings_keep_the_last_samples_and_since_answers_only_newer_ones() -> None:
    history = History(3, BUCKETS)
    for tick in range(5):
        history.record(snap(tick * 5.0, {"m": reading({"ok": tick * 10.0})}))
    answer = history.answer()
    assert answer["times"] == [EPOCH + 10, EPOCH + 15, EPOCH + 20]
    assert series(answer, "m")["requests_ok"] == [2.0, 2.0, 2.0]
    newer = history.answer(since=EPOCH + 15)
    assert newer["times"] == [EPOCH + 20]
    assert series(newer, "m")["requests_ok"] == [2.0]
    assert history.answer(since=EPOCH + 20)["times"] == []
    assert history.answer(since=EPOCH + 20)["models"][0]["series"]["requests_ok"] == []
    assert history.answer(since=0)["times"] == answer["times"]


def test_a_model_that_comes_later_is_null_before_it_and_one_that_leaves_is_null_after() -> None:
    history = History(4, BUCKETS)
    history.record(snap(0, {"a": reading({"ok": 0})}))
    history.record(snap(5, {"a": reading({"ok": 5}), "b": reading({"ok": 100})}))
    history.record(snap(10, {"b": reading({"ok": 110})}))
    answer = history.answer()
    assert series(answer, "a")["requests_ok"] == [None, 1.0, None]
    assert series(answer, "b")["requests_ok"] == [None, None, 2.0]  # nothing to diff at first
    for tick in range(3, 7):
        history.record(snap(tick * 5.0, {"b": reading({"ok": 110})}))
    assert [m["model"] for m in history.answer()["models"]] == ["b"]  # "a" left the rings


def test_backends_show_their_lane_at_each_sample_and_their_latest_budget() -> None:
    history = History(10, BUCKETS)
    budget = {"used": 1, "limit": 5, "left": 4, "frees_in_seconds": 12.5}
    history.record(snap(0, backends={"chat": BackendReading("org/chat", "ready")}))
    history.record(snap(5, backends={"chat": BackendReading("org/chat", "restarting", budget)}))
    history.record(
        snap(
            10,
            backends={
                "chat": BackendReading("org/chat", "no such lane"),
                "old": BackendReading("org/old", "retired"),
            },
        )
    )
    backends = history.answer()["backends"]
    assert backends == [
        {
            "role": "chat",
            "model": "org/chat",
            "states": ["ready", "restarting", "unknown"],
            "restart_budget": None,
        },
        {
            "role": "old",
            "model": "org/old",
            "states": [None, None, "retired"],
            "restart_budget": None,
        },
    ]
    assert history.answer(since=EPOCH + 5)["backends"][0]["states"] == ["unknown"]


def event(ts: float, name: str = "backend_exited") -> Event:
    return Event(ts, name, "chat", "org/chat", "restarting", None, "exited")


def test_the_events_ring_keeps_the_last_ones_and_since_answers_them_with_their_sample() -> None:
    history = History(10, BUCKETS, max_events=3)
    history.note(event(EPOCH + n) for n in range(2))
    history.record(snap(5))
    history.note(event(EPOCH + n) for n in range(2, 4))  # read from the log a turn late
    history.record(snap(10))
    assert [e["ts"] for e in history.answer()["events"]] == [EPOCH + 1, EPOCH + 2, EPOCH + 3]
    # A page holding the first sample gets what was noted after it, however old.
    assert [e["ts"] for e in history.answer(since=EPOCH + 5)["events"]] == [EPOCH + 2, EPOCH + 3]
    assert history.answer(since=EPOCH + 10)["events"] == []
    assert history.answer()["events"][1] == {
        "ts": EPOCH + 2,
        "event": "backend_exited",
        "role": "chat",
        "model": "org/chat",
        "lane": "restarting",
        "mark": None,
        "reason": "exited",
    }


def test_a_sample_that_failed_part_way_leaves_a_gap_and_the_next_ones_are_kept() -> None:
    history = History(10, BUCKETS)
    history.record(snap(0, {"m": reading({"ok": 0})}))
    broken: Any = {"free_mb": "not a number"}  # a bug upstream of the history
    with pytest.raises(TypeError):
        history.record(snap(5, {"m": reading({"ok": 5})}, machine=broken))
    history.record(snap(10, {"m": reading({"ok": 20})}))
    history.record(snap(15, {"m": reading({"ok": 25})}))
    answer = history.answer()
    assert answer["times"] == [EPOCH, EPOCH + 5, EPOCH + 10, EPOCH + 15]
    assert answer["machine"]["free_mb"] == [None] * 4
    # Rates over the interval since the last sample taken whole: 20 in 10 s.
    assert series(answer, "m")["requests_ok"] == [None, None, 2.0, 1.0]


def test_times_go_on_from_the_first_wall_clock_by_the_monotonic_one() -> None:
    """The wall clock stepped forward and back between samples moves no time after the
    first; a monotonic clock that did not move still gives later times."""
    history = History(10, BUCKETS)
    history.record(Snapshot(wall=EPOCH, clock=100.0))
    history.record(Snapshot(wall=EPOCH + 3600, clock=105.0))  # stepped an hour ahead
    history.record(Snapshot(wall=EPOCH - 60, clock=110.0))  # and then behind
    history.record(Snapshot(wall=EPOCH + 15, clock=110.0))  # a clock that did not move
    assert history.answer()["times"] == [EPOCH, EPOCH + 5, EPOCH + 10, EPOCH + 10.001]


def test_an_event_later_than_its_sample_is_answered_at_the_samples_time() -> None:
    """Events are read before their sample is taken, so one stamped later is forged (or
    its writer's clock is ahead): it is answered at its sample's time; others as
    stamped."""
    history = History(10, BUCKETS)
    history.record(snap(0))
    history.note([event(EPOCH + 3), event(EPOCH + 1e7), event(1e308)])
    history.record(snap(5))
    history.note([event(EPOCH + 1e7)])
    history.record(snap(10))
    assert [e["ts"] for e in history.answer()["events"]] == [
        EPOCH + 3,
        EPOCH + 5,
        EPOCH + 5,
        EPOCH + 10,
    ]


def test_events_noted_for_a_sample_not_yet_taken_wait_for_it() -> None:
    """A read of the log that ends between two samples notes its events for the next:
    no answer holds them before it (a page asking ``since`` its last sample would get
    them twice)."""
    history = History(10, BUCKETS)
    history.record(snap(0))
    history.note([event(EPOCH + 1)])
    assert history.answer()["events"] == []
    assert history.answer(since=EPOCH)["events"] == []
    history.record(snap(5))
    assert [e["ts"] for e in history.answer(since=EPOCH)["events"]] == [EPOCH + 1]


def test_an_answer_holds_the_newest_samples_at_most_and_says_it_left_some_out() -> None:
    """More samples than an answer holds (an hour at 0.2 s is 18,000): the newest
    MAX_ANSWER_SAMPLES, ``truncated``, and only the events that go with them."""
    total = MAX_ANSWER_SAMPLES + 10
    history = History(total, BUCKETS)
    for n in range(total):
        history.note([event(EPOCH + n - 0.5)])
        history.record(snap(n, {"m": reading({"ok": n})}))
    answer = history.answer()
    assert answer["truncated"] is True
    assert answer["times"] == [EPOCH + n for n in range(10, total)]
    assert len(series(answer, "m")["requests_ok"]) == MAX_ANSWER_SAMPLES
    assert [e["ts"] for e in answer["events"]] == [EPOCH + n - 0.5 for n in range(10, total)]
    old = history.answer(since=EPOCH + 4)
    assert old["truncated"] is True and old["times"] == answer["times"]
    assert old["events"] == answer["events"]
    newer = history.answer(since=EPOCH + 10)
    assert newer["truncated"] is False
    assert newer["times"] == [EPOCH + n for n in range(11, total)]
    assert len(newer["events"]) == MAX_ANSWER_SAMPLES - 1
