"""Consecutive-failure streaks per backend, and when they trip. Pure.

Within an unbroken run of failures (no health in between) each failure class keeps
its own count; a class reaching the threshold trips. Health ends the run, ignored
outcomes leave it untouched, and a stall trips on its own.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from slm_server.contracts.verdicts import FailureClass, Outcome, Verdict


@dataclass(frozen=True)
class Trip:
    """A streak that crossed the threshold: restart this backend."""

    key: str
    failure: FailureClass
    count: int


@dataclass
class Streaks:
    """Failure streaks keyed by backend (its role)."""

    threshold: int
    _counts: dict[str, Counter[FailureClass]] = field(default_factory=dict)

    def record(self, key: str, outcome: Outcome) -> Trip | None:
        """Fold one outcome into ``key``'s streak; a :class:`Trip` when it trips, after
        which the streak starts over."""
        if outcome.verdict is Verdict.HEALTH:
            self._counts.pop(key, None)
            return None
        if outcome.verdict is Verdict.IGNORE or outcome.failure is None:
            return None
        counts = self._counts.setdefault(key, Counter())
        counts[outcome.failure] += 1
        count = counts[outcome.failure]
        if outcome.failure is FailureClass.STALL or count >= self.threshold:
            self._counts.pop(key, None)
            return Trip(key, outcome.failure, count)
        return None

    def count(self, key: str, failure: FailureClass) -> int:
        """How many failures of ``failure``'s class ``key``'s open streak holds."""
        return self._counts.get(key, Counter())[failure]

    def open(self, key: str) -> int:
        """How many failures ``key``'s open streak holds (0 when none)."""
        return sum(self._counts.get(key, Counter()).values())

    def reset(self, key: str) -> None:
        self._counts.pop(key, None)
