"""The restart budget: at most N restarts per sliding window, with a cooldown. Pure;
time is passed in (monotonic seconds)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class RestartBudget:
    """``max_restarts`` per ``window`` seconds, ``cooldown`` seconds apart."""

    max_restarts: int
    window: float
    cooldown: float
    _times: deque[float] = field(default_factory=deque)
    _last: float | None = None

    def _expire(self, now: float) -> None:
        while self._times and now - self._times[0] >= self.window:
            self._times.popleft()

    def exhausted(self, now: float) -> bool:
        """True when another restart now would exceed the budget."""
        self._expire(now)
        return len(self._times) >= self.max_restarts

    def cooling(self, now: float) -> bool:
        """True while the last restart is more recent than the cooldown."""
        return self._last is not None and now - self._last < self.cooldown

    def spend(self, now: float) -> int:
        """Record a restart at ``now``; returns how many the window now holds."""
        self._expire(now)
        self._times.append(now)
        self._last = now
        return len(self._times)

    @property
    def used(self) -> int:
        return len(self._times)

    def spent_at(self, now: float) -> tuple[float, ...]:
        """When (monotonic) each restart the window holds at ``now`` was spent."""
        self._expire(now)
        return tuple(self._times)
