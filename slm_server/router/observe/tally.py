"""Counters and histograms kept as plain numbers, exposed through prometheus_client only
when scraped.

prometheus_client's own ``Counter`` and ``Histogram`` take a lock for every increment
and check each observation several ways: about 19 µs of the router's CPU per request
for its ten updates. The router updates its metrics from its event loop alone, so a
family here is a dict from label values to numbers, and :meth:`Counts.family` and
:meth:`Spread.family` build prometheus_client's metric families from it at scrape time:
the exposition is the one prometheus_client writes for its own kinds (``_total`` and
``_created`` for a counter; cumulative ``_bucket`` lines with ``le``, ``_count``,
``_sum`` and ``_created`` for a histogram). Not thread-safe: one writer, one loop.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Sequence
from typing import Final, cast

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

Labels = tuple[str, ...]
# How prometheus_client writes a bucket's upper bound (its ``le`` label).
_le: Final = cast(Callable[[float], str], floatToGoString)


class Counts:
    """A counter family: a running total per label values."""

    __slots__ = ("_cells", "doc", "labels", "name")

    def __init__(self, name: str, doc: str, labels: Sequence[str]) -> None:
        self.name = name
        self.doc = doc
        self.labels = tuple(labels)
        self._cells: dict[Labels, list[float]] = {}  # [total, created]

    def inc(self, labels: Labels, amount: float = 1.0) -> None:
        cell = self._cells.get(labels)
        if cell is None:
            cell = self._cells[labels] = [0.0, time.time()]
        cell[0] += amount

    def value(self, labels: Labels) -> float:
        cell = self._cells.get(labels)
        return 0.0 if cell is None else cell[0]

    def sums(self, *names: str) -> dict[Labels, float]:
        """The totals summed over every other label, keyed by the values of ``names``
        (in that order); one pass over the cells, for a reader that samples them."""
        at = [self.labels.index(name) for name in names]
        sums: dict[Labels, float] = {}
        for labels, (total, _created) in self._cells.items():
            key = tuple(labels[i] for i in at)
            sums[key] = sums.get(key, 0.0) + total
        return sums

    def family(self) -> CounterMetricFamily:
        family = CounterMetricFamily(self.name, self.doc, labels=self.labels)
        for labels, (total, created) in self._cells.items():
            family.add_metric(labels, total, created=created)
        return family


class Spread:
    """A histogram family: per label values, a count per bucket (a value goes in the
    first bucket whose upper bound it does not exceed), their sum and when it began."""

    __slots__ = ("_bounds", "_cells", "_les", "doc", "labels", "name")

    def __init__(
        self, name: str, doc: str, labels: Sequence[str], buckets: Sequence[float]
    ) -> None:
        self.name = name
        self.doc = doc
        self.labels = tuple(labels)
        self._bounds = tuple(sorted(float(b) for b in buckets if b != float("inf")))
        self._les = (*(_le(b) for b in self._bounds), "+Inf")
        self._cells: dict[Labels, _Cell] = {}

    def observe(self, labels: Labels, value: float) -> None:
        cell = self._cells.get(labels)
        if cell is None:
            cell = self._cells[labels] = _Cell(len(self._bounds) + 1)
        cell.counts[bisect_left(self._bounds, value)] += 1
        cell.total += value

    @property
    def bounds(self) -> tuple[float, ...]:
        """The buckets' upper bounds, ascending; a last bucket, ``+Inf``, follows."""
        return self._bounds

    def buckets_by(self, name: str) -> dict[str, list[int]]:
        """The count in each bucket (not cumulative; ``+Inf``'s last) summed over every
        other label, by the value of label ``name``; one pass over the cells."""
        at = self.labels.index(name)
        sums: dict[str, list[int]] = {}
        for labels, cell in self._cells.items():
            found = sums.get(labels[at])
            if found is None:
                sums[labels[at]] = list(cell.counts)
            else:
                for i, count in enumerate(cell.counts):
                    found[i] += count
        return sums

    def family(self) -> HistogramMetricFamily:
        family = HistogramMetricFamily(self.name, self.doc, labels=self.labels)
        for labels, cell in self._cells.items():
            running = 0.0
            buckets: list[tuple[str, float]] = []
            for le, count in zip(self._les, cell.counts, strict=True):
                running += count
                buckets.append((le, running))
            family.add_metric(labels, buckets, cell.total)
            named = dict(zip(self.labels, labels, strict=True))
            family.samples.append(Sample(f"{self.name}_created", named, cell.created, None))
        return family


class _Cell:
    __slots__ = ("counts", "created", "total")

    def __init__(self, size: int) -> None:
        self.counts = [0] * size
        self.total = 0.0
        self.created = time.time()
