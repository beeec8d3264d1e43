"""Consecutive-failure streaks per backend and when they trip."""

from __future__ import annotations

import pytest

from slm_server.contracts.verdicts import (
    BROKEN,
    HEALTHY,
    STALLED,
    TIMED_OUT,
    UNREACHABLE,
    FailureClass,
    Outcome,
    Verdict,
    classify_status,
)
from slm_server.router.watchdog.streaks import Streaks, Trip

KEY = "standard"


def feed(streaks: Streaks, *items: int | Outcome, key: str = KEY) -> list[Trip | None]:
    """Record each item (a status code or an outcome) and return what each one gave."""
    results: list[Trip | None] = []
    for item in items:
        outcome = classify_status(item) if isinstance(item, int) else item
        results.append(streaks.record(key, outcome))
    return results


def test_two_5xx_trip() -> None:
    streaks = Streaks(threshold=2)
    assert feed(streaks, 500, 500) == [None, Trip(KEY, FailureClass.SERVER_ERROR, 2)]


def test_different_5xx_codes_share_a_class() -> None:
    streaks = Streaks(threshold=2)
    assert feed(streaks, 502, 503) == [None, Trip(KEY, FailureClass.SERVER_ERROR, 2)]


def test_health_in_between_resets() -> None:
    streaks = Streaks(threshold=2)
    assert feed(streaks, 500, 200, 500) == [None, None, None]
    assert streaks.open(KEY) == 1


@pytest.mark.parametrize("health", [200, 204, 299, 400, 404, 422])
def test_every_health_status_resets(health: int) -> None:
    streaks = Streaks(threshold=2)
    assert feed(streaks, 500, health, 500) == [None, None, None]


def test_two_429_trip_as_saturated() -> None:
    streaks = Streaks(threshold=2)
    assert feed(streaks, 429, 429) == [None, Trip(KEY, FailureClass.SATURATED, 2)]


def test_425_and_429_are_one_class() -> None:
    streaks = Streaks(threshold=2)
    assert feed(streaks, 425, 429) == [None, Trip(KEY, FailureClass.SATURATED, 2)]


def test_two_408_trip_as_timeout() -> None:
    streaks = Streaks(threshold=2)
    assert feed(streaks, 408, TIMED_OUT) == [None, Trip(KEY, FailureClass.TIMEOUT, 2)]


@pytest.mark.parametrize(
    ("outcome", "kind"),
    [
        (UNREACHABLE, FailureClass.UNREACHABLE),
        (TIMED_OUT, FailureClass.TIMEOUT),
        (BROKEN, FailureClass.BROKEN),
    ],
)
def test_transport_failures_trip(outcome: Outcome, kind: FailureClass) -> None:
    streaks = Streaks(threshold=2)
    assert feed(streaks, outcome, outcome) == [None, Trip(KEY, kind, 2)]


def test_ignored_status_neither_counts_nor_resets() -> None:
    streaks = Streaks(threshold=2)
    assert feed(streaks, 500, 418, 500) == [None, None, Trip(KEY, FailureClass.SERVER_ERROR, 2)]


def test_ignored_status_does_not_undo_a_reset() -> None:
    streaks = Streaks(threshold=2)
    assert feed(streaks, 500, 200, 418, 500) == [None, None, None, None]
    assert streaks.open(KEY) == 1


@pytest.mark.parametrize("status", [199, 301, 401, 403, 405, 409, 413, 418, 499])
def test_ignored_alone_never_trips_or_opens(status: int) -> None:
    streaks = Streaks(threshold=1)
    assert feed(streaks, status, status, status) == [None, None, None]
    assert streaks.open(KEY) == 0


def test_classes_are_counted_separately_within_a_run() -> None:
    streaks = Streaks(threshold=2)
    assert feed(streaks, 500, 429, 500) == [None, None, Trip(KEY, FailureClass.SERVER_ERROR, 2)]


def test_alternating_classes_do_not_trip_until_one_reaches_the_threshold() -> None:
    streaks = Streaks(threshold=3)
    results = feed(streaks, 500, 429, UNREACHABLE, 500, 429, BROKEN)
    assert results == [None] * 6
    assert streaks.open(KEY) == 6
    assert feed(streaks, 429) == [Trip(KEY, FailureClass.SATURATED, 3)]


def test_stall_trips_at_once() -> None:
    streaks = Streaks(threshold=2)
    assert feed(streaks, STALLED) == [Trip(KEY, FailureClass.STALL, 1)]
    assert streaks.open(KEY) == 0


def test_stall_trips_at_once_with_a_high_threshold() -> None:
    streaks = Streaks(threshold=5)
    assert feed(streaks, 500, STALLED) == [None, Trip(KEY, FailureClass.STALL, 1)]


def test_a_trip_starts_the_streak_over() -> None:
    streaks = Streaks(threshold=2)
    assert feed(streaks, 500, 500)[-1] is not None
    assert streaks.open(KEY) == 0
    assert feed(streaks, 500) == [None]
    assert streaks.open(KEY) == 1
    assert feed(streaks, 500) == [Trip(KEY, FailureClass.SERVER_ERROR, 2)]


def test_a_trip_clears_other_classes_too() -> None:
    streaks = Streaks(threshold=2)
    feed(streaks, 429, 500, 500)
    assert streaks.open(KEY) == 0
    assert feed(streaks, 429) == [None]


def test_a_stall_trip_clears_the_open_streak() -> None:
    streaks = Streaks(threshold=2)
    feed(streaks, 500, STALLED)
    assert streaks.open(KEY) == 0
    assert feed(streaks, 500) == [None]


def test_streaks_are_per_key() -> None:
    streaks = Streaks(threshold=2)
    assert feed(streaks, 500, key="a") == [None]
    assert feed(streaks, 500, key="b") == [None]
    assert streaks.open("a") == 1
    assert streaks.open("b") == 1
    assert feed(streaks, 200, key="b") == [None]
    assert streaks.open("a") == 1
    assert streaks.open("b") == 0
    assert feed(streaks, 500, key="a") == [Trip("a", FailureClass.SERVER_ERROR, 2)]
    assert streaks.open("b") == 0


def test_a_trip_on_one_key_leaves_others_alone() -> None:
    streaks = Streaks(threshold=2)
    feed(streaks, 429, key="b")
    feed(streaks, STALLED, key="a")
    assert streaks.open("b") == 1


def test_open_counts_failures_of_every_class() -> None:
    streaks = Streaks(threshold=5)
    assert streaks.open(KEY) == 0
    feed(streaks, 500)
    assert streaks.open(KEY) == 1
    feed(streaks, 429, 418)
    assert streaks.open(KEY) == 2
    feed(streaks, UNREACHABLE)
    assert streaks.open(KEY) == 3
    feed(streaks, 200)
    assert streaks.open(KEY) == 0


def test_open_of_an_unknown_key_is_zero_and_creates_nothing() -> None:
    streaks = Streaks(threshold=2)
    assert streaks.open("nobody") == 0
    assert feed(streaks, 500, key="nobody") == [None]


def test_health_on_a_fresh_key_is_harmless() -> None:
    streaks = Streaks(threshold=2)
    assert feed(streaks, HEALTHY, 200) == [None, None]
    assert streaks.open(KEY) == 0


def test_reset() -> None:
    streaks = Streaks(threshold=2)
    feed(streaks, 500)
    streaks.reset(KEY)
    assert streaks.open(KEY) == 0
    assert feed(streaks, 500) == [None]
    streaks.reset("never-seen")


def test_failure_without_a_class_is_not_counted() -> None:
    streaks = Streaks(threshold=1)
    assert feed(streaks, Outcome(Verdict.FAILURE)) == [None]
    assert streaks.open(KEY) == 0


def test_threshold_one_trips_on_every_failure() -> None:
    streaks = Streaks(threshold=1)
    assert feed(streaks, 500, 429, UNREACHABLE, 200, 408) == [
        Trip(KEY, FailureClass.SERVER_ERROR, 1),
        Trip(KEY, FailureClass.SATURATED, 1),
        Trip(KEY, FailureClass.UNREACHABLE, 1),
        None,
        Trip(KEY, FailureClass.TIMEOUT, 1),
    ]


def test_threshold_one_ignores_ignored() -> None:
    streaks = Streaks(threshold=1)
    assert feed(streaks, 418) == [None]


def test_threshold_three() -> None:
    streaks = Streaks(threshold=3)
    assert feed(streaks, 500, 500) == [None, None]
    assert streaks.open(KEY) == 2
    assert feed(streaks, 500) == [Trip(KEY, FailureClass.SERVER_ERROR, 3)]


def test_threshold_three_reset_in_the_middle() -> None:
    streaks = Streaks(threshold=3)
    assert feed(streaks, 500, 500, 200, 500, 500) == [None] * 5
    assert feed(streaks, 418, 500) == [None, Trip(KEY, FailureClass.SERVER_ERROR, 3)]


def test_threshold_three_stall_still_trips_at_once() -> None:
    streaks = Streaks(threshold=3)
    assert feed(streaks, STALLED) == [Trip(KEY, FailureClass.STALL, 1)]
