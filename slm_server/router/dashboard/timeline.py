"""The dashboard's timeline, pure: the lane state a backend is in, from what the
supervisor publishes (:func:`lane_of`) or from a watchdog event that begins it
(:data:`EVENT_LANES`), and the marks some events leave on every chart
(:data:`EVENT_MARKS`).

A lane state is one of :data:`LANES`; the history keeps it as its index there. The
published states map to themselves, with three exceptions: ``ready`` while the
router's failure streak on the backend is open (``degraded`` in the health views) and
a remote's ``ejected`` are ``suspected``; a state published by a launcher that is gone,
or never published, is ``unknown``. ``confirming`` (a trip being confirmed) and
``retired`` come from events, and from the backends a reload retires.

:func:`event_of` reads one line of ``logs/watchdog.jsonl`` into the small tuple the
history keeps (:class:`Event`), or None for a line that begins no lane and leaves no
mark: the lifecycle events only.
"""

from __future__ import annotations

import datetime
import json
import math
import sys
from collections.abc import Iterable
from typing import Any, Final, NamedTuple

LANES: Final = (
    "starting",
    "loading",
    "ready",
    "suspected",
    "confirming",
    "restarting",
    "abandoned",
    "unloading",
    "unloaded",
    "retired",
    "failed",
    "stopped",
    "disabled",
    "unknown",
)
LANE_INDEX: Final = {lane: index for index, lane in enumerate(LANES)}

EVENT_LANES: Final = {
    "backend_loading": "loading",
    "backend_loaded": "ready",
    "restart_succeeded": "ready",
    "restart_not_confirmed": "ready",
    "remote_readmitted": "ready",
    "backend_failure": "suspected",
    "remote_ejected": "suspected",
    "restart_requested": "confirming",
    "restart_confirmed": "restarting",
    "backend_exited": "restarting",
    "backend_not_running": "restarting",
    "restart_started": "restarting",
    "restart_failed": "restarting",
    "backend_abandoned": "abandoned",
    "backend_unloaded": "unloaded",
    "evicted_for_pressure": "unloaded",
    "backend_retiring": "retired",
    "backend_retired": "retired",
}
EVENT_MARKS: Final = {
    "restart_succeeded": "restart",
    "backend_loaded": "load",
    "backend_unloaded": "unload",
    "evicted_for_pressure": "eviction",
    "config_reloaded": "reload",
}
# Published states other than the lanes' own names.
_PUBLISHED: Final = {"ejected": "suspected", "degraded": "suspected"}
# A role or a model id, and a reason, as kept: at most this many characters, and fewer
# when one is stored wider than a byte (:func:`_text`), so that a full ring of events
# from a forged log stays small (docs/dashboard.md, Memory).
MAX_NAME_CHARS: Final = 128
MAX_REASON_CHARS: Final = 200
_SHARED_CHARS: Final = 64  # names and reasons this short are interned: they repeat


def lane_of(published: str | None, *, supervised: bool, failing: bool) -> str:
    """The lane state of a backend the supervisor published as ``published`` (None:
    nothing published); ``supervised``: the launcher that published it still runs;
    ``failing``: the router's failure streak on it is open."""
    if published is None or not supervised:
        return "unknown"
    if published == "ready" and failing:
        return "suspected"
    lane = _PUBLISHED.get(published, published)
    return lane if lane in LANE_INDEX else "unknown"


class Event(NamedTuple):
    """One lifecycle event as the history keeps it; :meth:`to_json` is its answer."""

    ts: float  # wall seconds
    event: str
    role: str | None
    model: str | None
    lane: str | None
    mark: str | None
    reason: str | None

    def to_json(self) -> dict[str, Any]:
        return self._asdict()


def _width(text: str) -> int:
    """The bytes each character of ``text`` takes in memory: CPython stores a string at
    1, 2 or 4 bytes a character, as its widest one needs."""
    widest = max(map(ord, text), default=0)
    return 1 if widest < 0x100 else 2 if widest < 0x10000 else 4


def _text(value: Any, most: int) -> str | None:
    """``value`` as text kept in at most ``most`` bytes of characters: ``most``
    characters, half as many when one is stored in 2 bytes, a quarter in 4."""
    if value is None:
        return None
    text = value if isinstance(value, str) else str(value)
    text = text[:most]
    if not text.isascii():  # a lone surrogate ("\ud800" in JSON) encodes as "?"
        text = text.encode("utf-8", "replace").decode("utf-8")
        text = text[: most // _width(text)]
    return sys.intern(text) if len(text) <= _SHARED_CHARS else text


def wall_seconds(ts: Any) -> float | None:
    """An event's ``ts`` (ISO-8601, ``Z`` for UTC, as the log writes it; or seconds) as
    wall seconds; None when it is neither."""
    if isinstance(ts, int | float) and not isinstance(ts, bool):
        try:
            seconds = float(ts)
        except OverflowError:  # an integer too large for a float
            return None
    elif isinstance(ts, str):
        try:
            moment = datetime.datetime.fromisoformat(ts.replace("Z", "+00:00"))
        except ValueError:
            return None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=datetime.UTC)
        seconds = moment.timestamp()
    else:
        return None
    return seconds if math.isfinite(seconds) else None


def event_of(text: str) -> Event | None:
    """The lifecycle event one log line records; None for any other line (not JSON,
    no time, an event that begins no lane and leaves no mark)."""
    try:
        record: Any = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(record, dict):
        return None
    name = record.get("event")
    if not isinstance(name, str) or (name not in EVENT_LANES and name not in EVENT_MARKS):
        return None
    ts = wall_seconds(record.get("ts"))
    if ts is None:
        return None
    try:
        return Event(
            ts=ts,
            event=sys.intern(name),
            role=_text(record.get("role"), MAX_NAME_CHARS),
            model=_text(record.get("model_id", record.get("model")), MAX_NAME_CHARS),
            lane=EVENT_LANES.get(name),
            mark=EVENT_MARKS.get(name),
            reason=_text(reason_of(record), MAX_REASON_CHARS),
        )
    except (ValueError, RecursionError):  # a field too long or too deep to show as text
        return None


def reason_of(record: dict[str, Any]) -> Any:
    """Why the event happened: its ``reason``; for a process's exit, which has none,
    the signal that ended it or its exit code."""
    reason = record.get("reason")
    if reason is not None or record.get("event") != "backend_exited":
        return reason
    if record.get("signal") is not None:
        return f"killed by {record['signal']}"
    code = record.get("exit_code")
    return None if code is None else f"exit code {code}"


def events_of(lines: Iterable[str]) -> list[Event]:
    """The lifecycle events among ``lines``, in their order."""
    return [event for event in map(event_of, lines) if event is not None]


__all__ = [
    "EVENT_LANES",
    "EVENT_MARKS",
    "LANES",
    "LANE_INDEX",
    "Event",
    "event_of",
    "events_of",
    "lane_of",
    "wall_seconds",
]
