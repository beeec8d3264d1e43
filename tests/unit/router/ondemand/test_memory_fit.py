"""Room in memory for a waiting model: every rule of :func:`make_room`, with plain
numbers for the clock."""

from __future__ import annotations

from slm_server.router.ondemand.memory_fit import Holder, Room, Rules, make_room

RULES = Rules(budget_mb=1000, max_loaded=None, hold_seconds=2.0, aging_seconds=20.0)
NOW = 100.0


def holder(role: str, mb: int, **fields: object) -> Holder:
    values: dict[str, object] = {"on_demand": True, "last_used": NOW - 60, **fields}
    return Holder(role, f"id-{role}", mb, **values)  # type: ignore[arg-type]


def room(mb: int, *holders: Holder, rules: Rules = RULES, waited: float = 0.0) -> Room:
    return make_room("new", mb, NOW - waited, holders, rules, NOW)


def test_a_model_that_fits_loads_at_once() -> None:
    assert room(400, holder("a", 600)) == Room(True)
    assert room(1000) == Room(True)


def test_a_model_larger_than_the_budget_never_loads() -> None:
    answer = room(1001)
    assert answer.impossible and not answer.load
    assert "1001 MiB" in answer.why and "SLM_MEMORY_BUDGET_MB" in answer.why


def test_the_least_recently_used_idle_model_is_evicted_and_only_as_many_as_needed() -> None:
    old = holder("old", 400, last_used=NOW - 50)
    older = holder("older", 400, last_used=NOW - 90)
    recent = holder("recent", 100, last_used=NOW - 10)
    answer = room(400, old, older, recent)
    assert answer == Room(False, evict=("older",), why="making room")
    answer = room(700, old, older, recent)
    assert answer.evict == ("older", "old")


def test_always_models_and_busy_models_are_never_evicted() -> None:
    always = holder("always", 600, on_demand=False, last_used=NOW - 999)
    streaming = holder("streaming", 300, in_flight=1, last_used=NOW - 999)
    queued = holder("queued", 100, queued=2, last_used=NOW - 999)
    answer = room(500, always, streaming, queued)
    assert not answer.load and answer.evict == () and answer.drain == ()
    assert "in use: id-always, id-streaming, id-queued" in answer.why


def test_nothing_is_evicted_for_a_load_that_still_would_not_fit() -> None:
    always = holder("always", 700, on_demand=False)
    idle = holder("idle", 200)
    answer = room(400, always, idle)  # 700 stays: 400 can never fit beside it
    assert answer.evict == () and not answer.load


def test_a_model_used_within_the_hold_is_kept_until_the_waiter_ages() -> None:
    just_used = holder("just", 600, last_used=NOW - 1.0)
    assert room(600, just_used).evict == ()
    assert room(600, just_used, waited=20.0).evict == ("just",)


def test_an_aged_waiter_drains_a_busy_model_in_its_way() -> None:
    busy = holder("busy", 600, in_flight=1, queued=3, last_used=NOW - 0.5)
    assert room(600, busy, waited=5.0) == Room(False, why=room(600, busy).why)
    answer = room(600, busy, waited=25.0)
    assert answer.drain == ("busy",) and answer.evict == ()
    # Once drained and its in-flight request done, its queue does not keep it.
    drained = holder("busy", 600, queued=3, draining=True, last_used=NOW - 0.1)
    assert room(600, drained, waited=26.0).evict == ("busy",)


def test_a_model_being_unloaded_counts_as_gone_and_the_waiter_waits_for_it() -> None:
    going = holder("going", 600, unloading=True)
    answer = room(600, going)
    assert not answer.load and answer.evict == ()
    assert "unloaded" in answer.why


def test_max_loaded_counts_models_as_well_as_memory() -> None:
    rules = Rules(budget_mb=10_000, max_loaded=2, hold_seconds=2.0, aging_seconds=20.0)
    a, b = holder("a", 10, last_used=NOW - 30), holder("b", 10, last_used=NOW - 40)
    assert room(10, a, rules=rules) == Room(True)
    assert room(10, a, b, rules=rules).evict == ("b",)
    busy_a, busy_b = holder("a", 10, in_flight=1), holder("b", 10, in_flight=1)
    assert "SLM_MAX_LOADED=2" in room(10, busy_a, busy_b, rules=rules).why


def test_the_waiter_itself_is_not_counted_as_holding_memory() -> None:
    itself = Holder("new", "id-new", 900, on_demand=True)
    assert room(900, itself) == Room(True)


def test_alternating_traffic_swaps_at_most_once_per_hold() -> None:
    """Two 600 MiB models in 1000 MiB and one client asking each in turn, each answer
    at once: the swaps are bounded by the hold, and the client is still served."""
    rules = Rules(1000, None, hold_seconds=5.0, aging_seconds=20.0)
    loaded, used = "a", NOW
    wanted, since = "b", NOW
    swaps = served = 0
    for tick in range(240):  # 60 s in quarter seconds
        now = NOW + tick * 0.25
        if wanted != loaded:
            other = Holder(loaded, loaded, 600, on_demand=True, last_used=used)
            if not make_room(wanted, 600, since, [other], rules, now).evict:
                continue
            loaded, swaps = wanted, swaps + 1
        used, served = now, served + 1
        wanted, since = ("a" if wanted == "b" else "b"), now
    assert 1 <= swaps <= 60 / rules.hold_seconds + 1
    assert served >= swaps
