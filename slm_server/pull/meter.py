"""One file's transfer, measured: bytes so far, the rate over the last few seconds,
the time left, and whether it has stalled (pure; the clock is given).

A download stalls when, over the last ``stall_seconds``, it averaged less than
``min_bytes_per_second`` — a hub dripping a byte at a time is as stuck as a silent one,
and a read timeout alone never catches it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

RATE_WINDOW_SECONDS = 5.0


@dataclass
class Meter:
    total: int | None
    started: float
    resumed: int = 0  # bytes already there when this transfer began
    stall_seconds: float = 30.0
    min_bytes_per_second: int = 1024
    done: int = field(init=False)
    _marks: deque[tuple[float, int]] = field(init=False, default_factory=deque)

    def __post_init__(self) -> None:
        self.done = self.resumed
        self._marks.append((self.started, self.done))

    def advance(self, n: int, now: float) -> None:
        """``n`` more bytes arrived at ``now``."""
        self.done += n
        self._marks.append((now, self.done))
        keep = max(RATE_WINDOW_SECONDS, self.stall_seconds)
        while len(self._marks) > 2 and self._marks[1][0] <= now - keep:
            self._marks.popleft()

    def _since(self, now: float, seconds: float) -> tuple[float, int]:
        """The (time, bytes) mark at or before ``now - seconds`` (the oldest kept)."""
        chosen = self._marks[0]
        for mark in self._marks:
            if mark[0] > now - seconds:
                break
            chosen = mark
        return chosen

    def bytes_per_second(self, now: float) -> float | None:
        """The rate over the last :data:`RATE_WINDOW_SECONDS` (since the start when
        shorter); None before any time has passed."""
        then, at = self._since(now, RATE_WINDOW_SECONDS)
        if now - then <= 0:
            return None
        return (self.done - at) / (now - then)

    def seconds_left(self, now: float) -> float | None:
        rate = self.bytes_per_second(now)
        if self.total is None or not rate:
            return None
        return max(0.0, (self.total - self.done) / rate)

    def stalled(self, now: float) -> bool:
        """Less than the least rate on average over the last ``stall_seconds``."""
        if now - self.started < self.stall_seconds:
            return False
        then, at = self._since(now, self.stall_seconds)
        span = now - then
        return span > 0 and (self.done - at) < self.min_bytes_per_second * span


__all__ = ["RATE_WINDOW_SECONDS", "Meter"]
