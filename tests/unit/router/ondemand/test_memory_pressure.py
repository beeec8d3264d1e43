"""Memory pressure, the pure rule: below the floor loads are refused and idle
on-demand models are evicted least recently used first, as many as bring the free
memory back to where pressure ends; busy, ``always`` and unloading models are never
chosen; readings around the floor do not turn pressure on and off. The holders'
``last_used`` times come from a fake clock."""

from __future__ import annotations

from dataclasses import replace

import pytest

from slm_server.router.ondemand.memory_fit import Holder
from slm_server.router.ondemand.memory_pressure import (
    MIN_MARGIN_MB,
    Floor,
    holders_named,
    judge,
    refusal_reason,
    resume_mb,
)

FLOOR = Floor.of(1000)  # pressure ends at 1256 MiB free


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def tick(self, seconds: float) -> float:
        self.now += seconds
        return self.now


def used_in_turn(*roles: str, footprint_mb: int = 400) -> list[Holder]:
    """On-demand models, each used one second after the one before: the first is the
    least recently used."""
    clock = FakeClock()
    return [
        Holder(role, f"{role}-model", footprint_mb, on_demand=True, last_used=clock.tick(1.0))
        for role in roles
    ]


def test_resume_is_a_quarter_above_the_floor_and_at_least_the_margin() -> None:
    assert resume_mb(1000) == 1000 + MIN_MARGIN_MB
    assert resume_mb(4096) == 4096 + 1024
    assert Floor(1000, 1256) == FLOOR
    assert Floor.of(0) == Floor(0, 0) and not Floor.of(0).on


def test_above_the_floor_nothing_happens() -> None:
    verdict = judge(5000, FLOOR, False, used_in_turn("a", "b"))
    assert not verdict.below and not verdict.refuse_loads
    assert (verdict.entered, verdict.left, verdict.evict) == (False, False, ())


def test_below_the_floor_loads_are_refused_and_the_least_recently_used_goes_first() -> None:
    holders = used_in_turn("b", "c", "a")  # b is the least recently used, then c
    verdict = judge(990, FLOOR, False, holders)
    assert verdict.below and verdict.entered and verdict.refuse_loads
    # 266 MiB short of the resume level: one 400 MiB model is enough.
    assert verdict.evict == ("b",)
    # 656 short: two.
    assert judge(600, FLOOR, True, holders).evict == ("b", "c")
    # More short than all of them hold: every idle one goes.
    assert judge(10, FLOOR, True, holders).evict == ("b", "c", "a")


def test_holders_given_in_any_order_go_least_recently_used_first() -> None:
    holders = used_in_turn("b", "c", "a")
    assert judge(10, FLOOR, True, list(reversed(holders))).evict == ("b", "c", "a")


@pytest.mark.parametrize(("in_flight", "queued"), [(1, 0), (0, 1)])
def test_a_model_with_a_request_in_flight_or_queued_is_never_evicted(
    in_flight: int, queued: int
) -> None:
    b, c, a = used_in_turn("b", "c", "a")
    busy = replace(b, in_flight=in_flight, queued=queued)
    holders = [busy, c, a]  # the least recently used is busy
    verdict = judge(990, FLOOR, False, holders)
    assert verdict.evict == ("c",)
    assert "b" not in judge(10, FLOOR, True, holders).evict


def test_a_draining_model_is_idle_by_the_rule_room_is_made_by() -> None:
    [b] = used_in_turn("b")
    draining = replace(b, queued=2, draining=True)
    assert judge(990, FLOOR, False, [draining]).evict == ("b",)
    assert judge(990, FLOOR, False, [replace(draining, in_flight=1)]).evict == ()


def test_an_always_model_is_never_evicted_but_is_named_as_a_holder() -> None:
    always = Holder("chat", "chat-model", 3000, on_demand=False, last_used=0.0)
    [lazy] = used_in_turn("lazy")
    verdict = judge(10, FLOOR, False, [always, lazy])
    assert verdict.evict == ("lazy",)
    assert judge(10, FLOOR, False, [always]).evict == ()
    named = holders_named([lazy, always])
    assert named == [
        {
            "role": "chat",
            "model_id": "chat-model",
            "memory_mb": 3000,
            "load": "always",
            "busy": False,
        },
        {
            "role": "lazy",
            "model_id": "lazy-model",
            "memory_mb": 400,
            "load": "on_demand",
            "busy": False,
        },
    ]
    assert holders_named([replace(lazy, in_flight=1)])[0]["busy"] is True


def test_what_is_being_unloaded_counts_as_freed_and_is_not_chosen_again() -> None:
    b, c, a = used_in_turn("b", "c", "a")
    going = replace(b, unloading=True)
    # 266 short, and b's 400 are on their way out: nothing more to evict.
    assert judge(990, FLOOR, True, [going, c, a]).evict == ()
    # 656 short: b's 400 are not enough, c goes too (b is not asked again).
    assert judge(600, FLOOR, True, [going, c, a]).evict == ("c",)


def test_no_flapping_around_the_floor() -> None:
    """Readings wandering across the floor enter pressure once and leave it once: not
    before the free memory reaches the resume level."""
    readings = [1200, 999, 1001, 990, 1100, 1255, 1010, 1256, 1100, 1001, 999]
    below, changes = False, []
    for free in readings:
        verdict = judge(free, FLOOR, below, [])
        if verdict.entered or verdict.left:
            changes.append(("entered" if verdict.entered else "left", free))
        below = verdict.below
    assert changes == [("entered", 999), ("left", 1256), ("entered", 999)]


def test_no_reading_changes_nothing() -> None:
    holders = used_in_turn("a")
    assert judge(None, FLOOR, False, holders) == judge(5000, FLOOR, False, holders)
    still = judge(None, FLOOR, True, holders)
    assert still.below and not still.left and still.evict == ()


def test_no_floor_never_refuses_or_evicts() -> None:
    off = Floor.of(0)
    assert judge(0, off, False, used_in_turn("a")).evict == ()
    assert not judge(0, off, False, []).below
    assert judge(0, off, True, []).left  # (a watch told it was below is told it left)


def test_the_refusal_names_the_floor_and_the_free_memory() -> None:
    why = refusal_reason(812, FLOOR)
    assert "812 MiB" in why and "1000 MiB" in why and "SLM_MEMORY_FLOOR_MB" in why
    assert "1256" in why
    assert "unknown" in refusal_reason(None, FLOOR)
