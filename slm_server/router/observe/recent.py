"""The last requests the router finished, and those under way, for the dashboard
(``GET /v1/ui/requests``).

:class:`RecentRequests` is a ring of plain tuples: the middleware appends one per
finished model request (a ``deque`` with a ``maxlen``, so the append is O(1), needs no
lock under the event loop and drops the oldest); the endpoint turns them into objects
only when asked.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Final

from slm_server.router.call.exchange import Exchange

CAPACITY: Final = 200
MAX_MODEL_CHARS: Final = 256
FIELDS: Final = (
    "time",
    "request_id",
    "model",
    "alias",
    "endpoint",
    "status",
    "queue_seconds",
    "ttft_seconds",
    "duration_seconds",
    "input_tokens",
    "output_tokens",
    "stream",
    "error_type",
    "replica",
    "prefix_match_chars",
    "tools",
    "load_seconds",
    "streamed_seconds",
    "backend",
    "preset",
    "error_message",
    "cached_tokens",
    "outcome",
)

Row = tuple[
    float,
    str,
    str | None,
    str | None,
    str,
    int | None,
    float | None,
    float | None,
    float,
    int | None,
    int | None,
    bool,
    str | None,
    str | None,
    int | None,
    str | None,
    float | None,
    float | None,
    str | None,
    tuple[str, ...],
    str | None,
    int | None,
    str | None,
]


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def streamed(exchange: Exchange) -> float | None:
    """The time from the answer's first chunk to its last (None before a second one)."""
    first, last = exchange.first_chunk, exchange.last_chunk
    return None if first is None or last is None or exchange.chunks < 2 else last - first


def presets_applied(exchange: Exchange) -> tuple[str, ...]:
    """The preset layers the registry laid on the request: its entry's, its alias's."""
    spec = exchange.spec
    if spec is None:
        return ()
    layers: tuple[str, ...] = ("entry",) if spec.entry.preset is not None else ()
    alias = exchange.alias
    if alias is not None and spec.entry.alias_preset(alias) is not None:
        layers += (f"alias {alias}",)
    return layers


class RecentRequests:
    """The last ``capacity`` finished model requests, oldest dropped first."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self.rows: deque[Row] = deque(maxlen=capacity)
        # The model requests under way, by their exchange (as many as are admitted and
        # queued: bounded by the admission limits and the bodies' budget).
        self.in_flight: dict[int, Exchange] = {}

    def begin(self, exchange: Exchange) -> None:
        """A model request arrived: it is under way until :meth:`end`."""
        self.in_flight[id(exchange)] = exchange

    def end(self, exchange: Exchange) -> None:
        self.in_flight.pop(id(exchange), None)

    def under_way(self) -> list[dict[str, Any]]:
        """Each request under way, the oldest first: its model, path, whether it streams,
        and where it waits (:meth:`Exchange.waiting`)."""
        now = time.perf_counter()
        shown = []
        for exchange in sorted(self.in_flight.values(), key=lambda e: e.started):
            spec = exchange.spec
            model = spec.entry.id if spec is not None else exchange.model
            if isinstance(model, str) and len(model) > MAX_MODEL_CHARS:
                model = model[:MAX_MODEL_CHARS]  # a client's string, unchecked
            item: dict[str, Any] = {
                "request_id": exchange.request_id,
                "model": model,
                "endpoint": exchange.path,
                "stream": exchange.stream,
            }
            item.update(exchange.waiting(now))
            shown.append(item)
        return shown

    def record(self, exchange: Exchange, outcome: str | None = None) -> None:
        """Keep one finished exchange: its model as routed (else as asked for), the
        alias the client named it by, and how it ended (the metrics' ``outcome``)."""
        spec = exchange.spec
        self.rows.append(
            (
                time.time(),
                exchange.request_id,
                spec.entry.id if spec is not None else exchange.model,
                exchange.alias,
                exchange.path,
                exchange.status,
                exchange.queue_seconds,
                exchange.time_to_first_chunk,
                exchange.duration,
                exchange.input_tokens,
                exchange.output_tokens,
                exchange.stream,
                exchange.error_type,
                # An entry with replicas: the one that served it, and its prefix match.
                spec.role if spec is not None and exchange.routing_rule is not None else None,
                exchange.prefix_match_chars,
                exchange.tool_summary,
                exchange.load_seconds,
                streamed(exchange),
                spec.role if spec is not None else None,
                presets_applied(exchange),
                exchange.error_message,
                exchange.cached_tokens,
                outcome,
            )
        )

    def newest_first(self) -> list[dict[str, Any]]:
        """Every kept request as an object, the newest first; times rounded."""
        shown = []
        for row in reversed(self.rows):
            item: dict[str, Any] = dict(zip(FIELDS, row, strict=True))
            item["time"] = round(row[0], 3)
            if isinstance(row[2], str) and len(row[2]) > MAX_MODEL_CHARS:
                item["model"] = row[2][:MAX_MODEL_CHARS]  # a client's string, unchecked
            item["queue_seconds"] = _rounded(row[6])
            item["ttft_seconds"] = _rounded(row[7])
            item["duration_seconds"] = _rounded(row[8])
            item["first_byte_seconds"] = item["ttft_seconds"]
            item["load_seconds"] = _rounded(row[16])
            item["streamed_seconds"] = _rounded(row[17])
            item["preset"] = list(row[19])
            shown.append(item)
        return shown


__all__ = ["CAPACITY", "RecentRequests"]
