"""What :func:`~slm_server.supervise.core.decide.decide` asks the shell to carry out, in
order: events, log lines, launches, stops, probes, confirmations, footprints to
remember, and the answer to a router's command. Pure data."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Emit:
    event: str
    fields: Mapping[str, Any]


@dataclass(frozen=True)
class Log:
    level: int
    message: str


@dataclass(frozen=True)
class Launch:
    role: str


@dataclass(frozen=True)
class Stop:
    """Stop ``pid``: SIGTERM then SIGKILL, or (``kill``) SIGKILL at once; ``save``:
    first save its slots (an unload of a ready backend, see ``slot_saves``)."""

    role: str
    pid: int
    kill: bool = False
    save: bool = False


@dataclass(frozen=True)
class Probe:
    role: str


@dataclass(frozen=True)
class Confirm:
    role: str
    reason: str


@dataclass(frozen=True)
class Remember:
    """Keep ``resident_mb`` as the backend's footprint (across runs)."""

    role: str
    resident_mb: int


@dataclass(frozen=True)
class Answer:
    """The reply to a router's command: taken or not, the state right after, why not."""

    accepted: bool
    state: str | None = None
    error: str | None = None


Action = Emit | Log | Launch | Stop | Probe | Confirm | Remember | Answer
