"""What the dashboard's history holds in memory after it has filled: ``--seconds`` of
samples every ``--interval`` seconds (an hour at the default 5 s: 720) for ``--models``
models, each its own backend, and a full ring of lifecycle events.

    python -m benchmarks.history_memory                 # 20 models, an hour at 5 s
    python -m benchmarks.history_memory --models 50

The history is fed synthetic snapshots with traffic on every model (the running totals
grow, every histogram moves, every gauge changes), a few more than its capacity so
that every ring has wrapped, and log lines read into events (a quarter of them with a
reason of their own, the rest repeating theirs). Two figures:
the memory allocated while it was built and still held once the snapshots fed to it
are gone (``tracemalloc``), and the sizes of every object reachable from it
(``sys.getsizeof``, each object once).

A third, the worst a forged log can make the events cost (:func:`forged_events_bytes`):
a full ring of events each read in a turn of its own, every one distinct, its role, model
and reason as long as kept, in characters of each width CPython stores (1, 2 and 4 bytes).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tracemalloc
from array import array
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from slm_server.contracts.events import utc_timestamp
from slm_server.router.dashboard.history import (
    MAX_EVENTS,
    BackendReading,
    Buckets,
    History,
    ModelReading,
    Snapshot,
)
from slm_server.router.dashboard.timeline import EVENT_LANES, events_of
from slm_server.router.observe.metrics import (
    FIRST_TOKEN_BUCKETS,
    OUTCOMES,
    QUEUE_BUCKETS,
    TOKENS_PER_SECOND_BUCKETS,
)

BUCKETS = Buckets(FIRST_TOKEN_BUCKETS, TOKENS_PER_SECOND_BUCKETS, QUEUE_BUCKETS)
MB = 1024 * 1024
# A character stored at each width, for the forged events: ASCII, Latin-1, 2 and 4 bytes.
WIDTHS = ("x", "\xe9", "\u4e2d", "\U0001f600")


@dataclass(frozen=True)
class Measured:
    samples: int
    models: int
    events: int
    traced_bytes: int  # allocated while building the history and still held
    walked_bytes: int  # the sizes of every object reachable from it


def _spread(tick: int, model: int, size: int) -> list[int]:
    """Running bucket counts that move every tick."""
    return [tick * ((model + b) % 3) + b for b in range(size)]


def _snapshot(tick: int, models: int, interval: float) -> Snapshot:
    readings = {}
    backends = {}
    for n in range(models):
        model = f"org/model-{n:02d}-instruct-q4_k_m"
        readings[model] = ModelReading(
            requests={o: float(tick * (i + n % 4)) for i, o in enumerate(OUTCOMES)},
            ttft=_spread(tick, n, len(FIRST_TOKEN_BUCKETS) + 1),
            tokens_per_second=_spread(tick, n + 1, len(TOKENS_PER_SECOND_BUCKETS) + 1),
            admission_wait=_spread(tick, n + 2, len(QUEUE_BUCKETS) + 1),
            prompt_tokens=float(tick * 1500),
            cached_tokens=float(tick * 900),
            in_flight=tick % 4,
            queued=tick % 3,
            memory_mb=300.0 + n + tick % 7,
        )
        lane = ("ready", "suspected", "restarting", "starting")[(tick + n) % 4]
        budget = {"used": tick % 5, "limit": 5, "left": 5 - tick % 5, "frees_in_seconds": 12.5}
        backends[f"role-{n:02d}"] = BackendReading(model, lane, budget)
    machine: dict[str, float | None] = {
        "free_mb": 9000.0 + tick % 50,
        "floor_mb": 1024.0,
        "budget_mb": 18000.0,
        "held_mb": 700.0 + tick % 9,
    }
    return Snapshot(1.765e9 + tick * interval, tick * interval, machine, readings, backends)


def _event_lines(count: int, models: int) -> Iterator[str]:
    """Log lines as the watchdog writes them, read as the sampler reads them."""
    names = sorted(EVENT_LANES)
    for n in range(count):
        record = {
            "ts": utc_timestamp(1.765e9 + n),
            "event": names[n % len(names)],
            "role": f"role-{n % models:02d}",
            "model_id": f"org/model-{n % models:02d}-instruct-q4_k_m",
            "port": 8500 + n % models,
            "reason": f"exited with status -9 after {n} requests" if n % 4 == 0 else "stall",
        }
        yield json.dumps(record)


def reachable_bytes(root: object) -> int:
    """The ``sys.getsizeof`` of every object reachable from ``root`` through containers,
    ``__dict__`` and ``__slots__``, each counted once (types and modules left out)."""
    seen: set[int] = set()
    stack: list[Any] = [root]
    total = 0
    while stack:
        item = stack.pop()
        if id(item) in seen or isinstance(item, type):
            continue
        seen.add(id(item))
        total += sys.getsizeof(item)
        if isinstance(item, str | bytes | int | float | array) or item is None:
            continue
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple | set | frozenset | deque):
            stack.extend(item)
        if hasattr(item, "__dict__"):
            stack.append(vars(item))
        for klass in type(item).__mro__:
            for name in getattr(klass, "__slots__", ()):
                if hasattr(item, name):
                    stack.append(getattr(item, name))
    return total


def measure(
    models: int = 20, seconds: float = 3600.0, interval: float = 5.0, events: int = MAX_EVENTS
) -> Measured:
    """The history after ``seconds`` of samples every ``interval`` for ``models``."""
    capacity = round(seconds / interval)
    gc.collect()
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        history = History(capacity, BUCKETS)
        for tick in range(capacity + 10):  # every ring has wrapped
            history.record(_snapshot(tick, models, interval))
        history.note(events_of(_event_lines(events, models)))
        gc.collect()
        traced = tracemalloc.get_traced_memory()[0] - before
    finally:
        if started:
            tracemalloc.stop()
    return Measured(capacity, models, len(history.events), traced, reachable_bytes(history))


def forged_events_bytes(char: str, events: int = MAX_EVENTS) -> int:
    """The bytes reachable from a history (of one sample) holding ``events`` lifecycle
    events of a forged log, each read in a turn of its own, each distinct, its role,
    model and reason made of ``char`` and longer than kept."""
    history = History(1, BUCKETS)
    for n in range(events):
        record = {
            "ts": 1.765e9 + n,
            "event": "backend_failure",
            "role": f"{n:05d}" + char * 300,
            "model_id": f"{n:05d}" + char * 300,
            "reason": f"{n:05d}" + char * 300,
        }
        history.note(events_of([json.dumps(record, ensure_ascii=False)]))
        history.record(Snapshot(1.765e9 + n, float(n)))
    return reachable_bytes(history)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=3600.0)
    parser.add_argument("--interval", type=float, default=5.0)
    args = parser.parse_args(argv)
    found = measure(args.models, args.seconds, args.interval)
    print(
        f"{found.models} models, {found.samples} samples "
        f"({args.seconds:g} s every {args.interval:g} s), {found.events} events: "
        f"{found.traced_bytes / MB:.2f} MiB allocated and held (tracemalloc), "
        f"{found.walked_bytes / MB:.2f} MiB reachable (sys.getsizeof)"
    )
    worst = max(forged_events_bytes(char) for char in WIDTHS)
    print(f"{MAX_EVENTS} events of a forged log at their worst: {worst / MB:.2f} MiB reachable")


__all__ = ["WIDTHS", "Measured", "forged_events_bytes", "measure", "reachable_bytes"]


if __name__ == "__main__":
    main()
