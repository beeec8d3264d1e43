"""Fixed-size rings of numbers: the storage of the dashboard's history.

A :class:`Ring` holds the last ``capacity`` values of one series, one value per tick
(the sampler's turn number), in an ``array`` of a fixed type: ``'d'`` for wall times
and measured values (NaN where there is none), ``'b'`` for a lane state's number
(``-1`` where there is none). It grows as ticks come, up to its capacity, and
then overwrites its oldest value; a series that began later than the others answers
"none" for the ticks before it began. Pure and single-threaded: one writer, on the
event loop.
"""

from __future__ import annotations

from array import array
from typing import Any, Final

MISSING_STATE: Final = -1


class Ring:
    """The values of ticks ``first`` .. ``end - 1`` that fit its capacity."""

    __slots__ = ("capacity", "end", "first", "missing", "values")

    def __init__(self, typecode: str, capacity: int, first: int = 0) -> None:
        if capacity < 1:
            raise ValueError("a ring holds at least one value")
        self.capacity = capacity
        self.first = first  # the tick of its first value
        self.end = first  # the tick its next value is for
        self.missing: float = MISSING_STATE if typecode in "bhil" else float("nan")
        self.values: array[Any] = array(typecode)

    @property
    def oldest(self) -> int:
        """The oldest tick still held (``end`` when it holds none)."""
        return max(self.first, self.end - self.capacity)

    def put(self, tick: int, value: float) -> None:
        """The value of ``tick``, which follows the last one put (ticks skipped in
        between are put as missing)."""
        if tick < self.end:
            raise ValueError(f"tick {tick} comes before {self.end}")
        while self.end < tick:
            self._append(self.missing)
        self._append(value)

    def _append(self, value: float) -> None:
        if len(self.values) < self.capacity:
            self.values.append(value)
        else:
            self.values[(self.end - self.first) % self.capacity] = value
        self.end += 1

    def span(self, start: int, stop: int) -> list[float]:
        """The values of ticks ``start`` .. ``stop - 1``, missing where not held."""
        if stop <= start:
            return []
        held_from, held_to = max(start, self.oldest), min(stop, self.end)
        if held_to <= held_from:
            return [self.missing] * (stop - start)
        before = [self.missing] * (held_from - start)
        after = [self.missing] * (stop - held_to)
        begin = (held_from - self.first) % self.capacity
        count = held_to - held_from
        values = self.values
        if begin + count <= len(values):
            middle = values[begin : begin + count].tolist()
        else:  # wrapped: the end of the array, then its start
            middle = values[begin:].tolist() + values[: begin + count - len(values)].tolist()
        return before + middle + after


__all__ = ["MISSING_STATE", "Ring"]
