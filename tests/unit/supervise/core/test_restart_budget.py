"""The restart budget: N restarts per sliding window, with a cooldown between them."""

from __future__ import annotations

from dataclasses import dataclass

from slm_server.supervise.core.restart_budget import RestartBudget


@dataclass
class FakeClock:
    """Monotonic seconds that only move when the test says so."""

    now: float = 1000.0

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


def budget(max_restarts: int = 5, window: float = 600.0, cooldown: float = 10.0) -> RestartBudget:
    return RestartBudget(max_restarts=max_restarts, window=window, cooldown=cooldown)


def test_fresh_budget() -> None:
    fresh = budget()
    assert fresh.used == 0
    assert not fresh.exhausted(0.0)
    assert not fresh.cooling(0.0)


def test_five_allowed_then_exhausted() -> None:
    clock = FakeClock()
    spent = budget()
    start = clock.now
    for expected in range(1, 6):
        assert not spent.exhausted(clock.now)
        assert not spent.cooling(clock.now)
        assert spent.spend(clock.now) == expected
        assert spent.used == expected
        clock.advance(20.0)
    assert spent.exhausted(clock.now)
    assert spent.exhausted(start + 599.999)
    assert spent.used == 5


def test_allowed_again_once_the_oldest_leaves_the_window() -> None:
    clock = FakeClock()
    spent = budget()
    oldest = clock.now
    for _ in range(5):
        spent.spend(clock.now)
        clock.advance(20.0)
    assert spent.exhausted(oldest + 599.999)
    assert not spent.exhausted(oldest + 600.0)
    assert spent.used == 4
    assert spent.spend(oldest + 600.0) == 5
    assert spent.exhausted(oldest + 600.0)
    # the second-oldest (oldest + 20) leaves at oldest + 620
    assert spent.exhausted(oldest + 619.999)
    assert not spent.exhausted(oldest + 620.0)


def test_window_slides_all_the_way() -> None:
    spent = budget()
    for t in (0.0, 10.0, 20.0, 30.0, 40.0):
        spent.spend(t)
    assert not spent.exhausted(10_000.0)
    assert spent.used == 0


def test_spend_returns_the_count_after_expiry() -> None:
    spent = budget(window=100.0, cooldown=0.0)
    assert spent.spend(0.0) == 1
    assert spent.spend(50.0) == 2
    assert spent.spend(100.0) == 2  # the one at 0 has left the window
    assert spent.spend(149.9) == 3
    assert spent.spend(500.0) == 1


def test_spend_beyond_the_budget_still_records() -> None:
    spent = budget(max_restarts=2)
    assert spent.spend(0.0) == 1
    assert spent.spend(1.0) == 2
    assert spent.exhausted(2.0)
    assert spent.spend(2.0) == 3
    assert spent.used == 3


def test_zero_restarts_is_always_exhausted() -> None:
    spent = budget(max_restarts=0)
    assert spent.exhausted(0.0)
    assert spent.exhausted(1e9)


def test_one_restart_per_window() -> None:
    spent = budget(max_restarts=1, window=60.0, cooldown=0.0)
    assert not spent.exhausted(0.0)
    spent.spend(0.0)
    assert spent.exhausted(59.0)
    assert not spent.exhausted(60.0)


def test_cooldown_between_restarts() -> None:
    clock = FakeClock()
    spent = budget(cooldown=10.0)
    last = clock.now
    spent.spend(last)
    assert spent.cooling(last)
    assert spent.cooling(last + 9.999)
    assert not spent.cooling(last + 10.0)
    assert not spent.cooling(last + 11.0)


def test_cooldown_follows_the_most_recent_restart() -> None:
    spent = budget(cooldown=10.0)
    spent.spend(0.0)
    spent.spend(15.0)
    assert spent.cooling(20.0)
    assert spent.cooling(24.999)
    assert not spent.cooling(25.0)


def test_zero_cooldown_never_cools() -> None:
    spent = budget(cooldown=0.0)
    spent.spend(5.0)
    assert not spent.cooling(5.0)


def test_cooling_does_not_expire_the_window() -> None:
    spent = budget(window=10.0, cooldown=1.0)
    spent.spend(0.0)
    assert not spent.cooling(100.0)
    assert spent.used == 1


def test_exhausted_and_cooling_are_independent() -> None:
    spent = budget(max_restarts=2, window=100.0, cooldown=10.0)
    spent.spend(0.0)
    spent.spend(5.0)
    assert spent.exhausted(6.0)
    assert spent.cooling(6.0)
    assert spent.exhausted(50.0)
    assert not spent.cooling(50.0)


def test_cooldown_survives_a_window_shorter_than_it() -> None:
    spent = budget(max_restarts=5, window=5.0, cooldown=10.0)
    spent.spend(0.0)
    assert not spent.exhausted(6.0)  # the supervisor asks this first
    assert spent.cooling(6.0)
