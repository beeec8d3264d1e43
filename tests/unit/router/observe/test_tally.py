"""The plain-number families expose exactly what prometheus_client's own Counter and
Histogram expose for the same updates (their ``_created`` times aside)."""

from __future__ import annotations

import re
from collections.abc import Iterable

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from slm_server.router.observe.tally import Counts, Spread

BUCKETS = (0.005, 0.1, 1.0, 2.5, 900.0)
LABELS = st.sampled_from([("a", "x"), ("b", "x"), ("a", "y")])
VALUES = st.sampled_from([0.0, 0.005, 0.0051, 0.1, 1.0, 3.0, 900.0, 901.0, 1e9]) | st.floats(
    min_value=0, max_value=1e4
)


Update = tuple[tuple[str, str], float]


class Ours(Collector):
    def __init__(self, *families: Counts | Spread) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return [family.family() for family in self.families]


def without_created(text: bytes) -> str:
    return re.sub(r"(_created\{[^}]*\}) \S+", r"\1 T", text.decode())


@given(st.lists(st.tuples(LABELS, VALUES), max_size=30))
def test_the_exposition_is_prometheus_clients_own(updates: list[Update]) -> None:
    theirs = CollectorRegistry(auto_describe=False)
    count = Counter("t_requests_total", "Requests.", ["model", "path"], registry=theirs)
    spread = Histogram("t_seconds", "Seconds.", ["model", "path"], buckets=BUCKETS, registry=theirs)
    counts = Counts("t_requests_total", "Requests.", ["model", "path"])
    seconds = Spread("t_seconds", "Seconds.", ["model", "path"], BUCKETS)
    mine = CollectorRegistry(auto_describe=False)
    mine.register(Ours(counts, seconds))
    for labels, value in updates:
        count.labels(*labels).inc(value)
        spread.labels(*labels).observe(value)
        counts.inc(labels, value)
        seconds.observe(labels, value)
    assert without_created(generate_latest(mine)) == without_created(generate_latest(theirs))
    for labels, _ in updates:
        assert counts.value(labels) == theirs.get_sample_value(
            "t_requests_total", dict(zip(("model", "path"), labels, strict=True))
        )


def test_a_value_on_a_bound_counts_in_that_bucket_and_one_above_all_in_inf() -> None:
    seconds = Spread("s", "S.", ["m"], (1.0, 2.0))
    for value in (1.0, 2.0, 2.0000001):
        seconds.observe(("a",), value)
    family = seconds.family()
    buckets = {s.labels["le"]: s.value for s in family.samples if s.name == "s_bucket"}
    assert buckets == {"1.0": 1, "2.0": 2, "+Inf": 3}
    created = [s for s in family.samples if s.name == "s_created"]
    assert len(created) == 1 and created[0].value > 0


def test_sums_and_buckets_by_one_label_add_up_the_other_labels() -> None:
    counts = Counts("t_requests_total", "Requests.", ["model", "path", "outcome"])
    counts.inc(("a", "x", "ok"), 2)
    counts.inc(("a", "y", "ok"), 3)
    counts.inc(("a", "y", "timeout"))
    counts.inc(("b", "x", "ok"), 7)
    assert counts.sums("model", "outcome") == {("a", "ok"): 5, ("a", "timeout"): 1, ("b", "ok"): 7}
    assert counts.sums("model") == {("a",): 6, ("b",): 7}
    seconds = Spread("t_seconds", "Seconds.", ["model", "path"], BUCKETS)
    for labels, value in (
        (("a", "x"), 0.05),
        (("a", "y"), 0.05),
        (("a", "y"), 2.0),
        (("b", "x"), 1e6),
    ):
        seconds.observe(labels, value)
    assert seconds.bounds == BUCKETS
    assert seconds.buckets_by("model") == {"a": [0, 2, 0, 1, 0, 0], "b": [0, 0, 0, 0, 0, 1]}
    assert seconds.buckets_by("path") == {"x": [0, 1, 0, 0, 0, 1], "y": [0, 1, 0, 1, 0, 0]}
