"""What the shell tells :func:`~slm_server.supervise.core.decide.decide`, one observation
per call: a launch ended, a process exited, a probe answered or was lost, a backend was
measured, a stop ended, a confirmation judged, the router asked (a restart request, a
load or an unload), the supervisor began or shut down, the clock moved. Pure data."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from slm_server.contracts.restart_requests import RestartRequest


@dataclass(frozen=True)
class Launched:
    """A launch ended: ``pid`` spawned, or ``failure`` (``retryable`` when time can fix
    it: a missing model file, a taken port)."""

    role: str
    pid: int | None
    failure: str | None = None
    retryable: bool = True


@dataclass(frozen=True)
class Exited:
    """The backend's process ended by itself; ``tail`` holds its log's last lines."""

    role: str
    pid: int
    status: int | None
    description: str
    tail: tuple[str, ...] = ()
    log_path: str = ""


@dataclass(frozen=True)
class HealthProbed:
    """A health probe's answer; ``resident_mb``: the process tree's resident memory,
    measured when the probe succeeded."""

    role: str
    ok: bool
    resident_mb: int | None = None


@dataclass(frozen=True)
class ProbeLost:
    """A health probe ended with no answer at all (its task failed): another may go out."""

    role: str


@dataclass(frozen=True)
class Measured:
    """A ready backend's process tree was measured again: ``resident_mb``, against the
    footprint it is admitted by (``admitted_mb``) of which ``prompt_cache_mb`` is what
    its prompt cache may fill (``None``: unbounded)."""

    role: str
    resident_mb: int
    admitted_mb: int | None = None
    prompt_cache_mb: int | None = 0


@dataclass(frozen=True)
class Begin:
    """The supervisor starts: each backend not yet begun takes its first phase."""


@dataclass(frozen=True)
class Shutdown:
    """The supervisor stopped every process it had, to exit: none is alive any more."""


@dataclass(frozen=True)
class Load:
    """The router asks for an on-demand model to be loaded."""

    role: str


@dataclass(frozen=True)
class Unload:
    """The router asks for an on-demand model's process to go: ``reason`` is
    ``idle_ttl``, ``evicted`` (to make room for ``for_model``), ``api`` or
    ``no_waiter`` (a load every request for it left)."""

    role: str
    reason: str
    for_model: str | None = None


@dataclass(frozen=True)
class LoadRequested:
    """The router's ``load`` command, to be answered (:class:`Answer`)."""

    role: str


@dataclass(frozen=True)
class UnloadRequested:
    """The router's ``unload`` command (see :class:`Unload`), to be answered."""

    role: str
    reason: str
    for_model: str | None = None


@dataclass(frozen=True)
class Released:
    """The process a Held backend waited for is gone."""

    role: str


@dataclass(frozen=True)
class Tick:
    """Time passed: retry waiting restarts, probe starting backends."""


@dataclass(frozen=True)
class Requested:
    """A restart request file from the router (its name when it was unreadable)."""

    request: RestartRequest | str


@dataclass(frozen=True)
class Judged:
    """Confirmation of a trip ended: ``restart`` or not, by ``rule``, with the evidence."""

    role: str
    restart: bool
    rule: str
    reason: str
    evidence: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Stopped:
    """A stop the shell carried out ended; ``survived`` when SIGKILL did not end it
    within its bound."""

    role: str
    pid: int
    status: int | None
    survived: bool = False


Observation = (
    Launched
    | Exited
    | HealthProbed
    | ProbeLost
    | Measured
    | Tick
    | Requested
    | Judged
    | Stopped
    | Load
    | Unload
    | LoadRequested
    | UnloadRequested
    | Begin
    | Shutdown
    | Released
)
