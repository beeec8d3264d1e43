"""Confirming a trip against the backend itself: the evidence, and the decision. Pure.

A trip of the router's (a 5xx, timeout or saturation streak, a first-byte stall, a
restart request) is a suspicion, not a verdict: requests can fail for their own
reasons while the backend serves everyone else. Before the supervisor restarts a
backend for anything but a process exit, ``evidence.gather`` looks at the backend
itself and :func:`judge` decides, by the first row of :data:`TABLE` that matches:

    process gone / zombie / stopped ............................ restart
    /health not 200 within its timeout ......................... restart
    one-token canary answered (2xx, or a 4xx that is no failure)  not confirmed
    every slot busy: progress (slots or CPU) -> not confirmed, none -> restart
    canary 5xx ................................................. restart
    canary 429/425: a free slot -> restart; else progress decides
    canary timed out, refused or broken: progress decides
    no canary: progress decides; idle: an unsupported model type -> not confirmed
    (nothing tells a wedge from an idle healthy backend), no time left -> restart

"Progress" is a busy slot of llama-server's ``/slots`` that moved between two samples,
or the process's CPU time advancing by at least :data:`CPU_BUSY_FRACTION` of one core
over the sampling window. Progress has to be seen: evidence that is missing (no
``/slots``, a CPU time that could not be read) never counts as progress. A backend
spinning in a loop while wedged burns CPU and so is never confirmed by the CPU rows;
the streaks trip again and again, each logged as ``restart_not_confirmed``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final

# CPU time per second of window that counts as "advancing": 5% of one core. An idle
# server answering the confirmation's own probes uses well under 1%.
CPU_BUSY_FRACTION: Final = 0.05
# ... and never less than two clock ticks, whatever the window.
CPU_MIN_SECONDS: Final = 0.02
# Canary statuses that mean "too busy", not "broken".
SATURATED: Final = frozenset({425, 429})


class ProcessStatus(enum.Enum):
    """What the OS says about the backend's process."""

    RUNNING = "running"  # running or sleeping: scheduled normally
    STOPPED = "stopped"  # SIGSTOP'd or stopped by a tracer: never scheduled
    ZOMBIE = "zombie"  # exited, not reaped yet
    GONE = "gone"  # no such process, or its pid now belongs to another one


class Reply(enum.Enum):
    """How a probe (``/health``, the canary) ended."""

    OK = "ok"  # /health 200; the canary 2xx
    FAILED = "failed"  # answered with another status
    TIMED_OUT = "timed_out"  # no connection or no answer within its timeout
    REFUSED = "refused"  # the connection was refused
    BROKEN = "broken"  # the connection broke, or the answer was not HTTP
    NOT_RUN = "not_run"  # not tried: see NotRun


class NotRun(enum.Enum):
    """Why a probe was not tried."""

    DECIDED = "decided"  # an earlier rule already decides
    NO_FREE_SLOT = "no_free_slot"  # every slot busy: a canary would only queue
    UNSUPPORTED = "unsupported_model_type"  # no one-token request for this model type
    NO_BUDGET = "budget_spent"  # the confirmation time ran out first


@dataclass(frozen=True)
class Probe:
    """The outcome of one probe: ``status`` for OK and FAILED, ``not_run`` for NOT_RUN."""

    reply: Reply
    status: int | None = None
    detail: str = ""
    not_run: NotRun | None = None

    def to_fields(self) -> dict[str, object]:
        fields: dict[str, object] = {"reply": self.reply.value}
        if self.status is not None:
            fields["status"] = self.status
        if self.not_run is not None:
            fields["not_run"] = self.not_run.value
        if self.detail:
            fields["detail"] = self.detail
        return fields


NOT_RUN_DECIDED: Final = Probe(Reply.NOT_RUN, not_run=NotRun.DECIDED)


@dataclass(frozen=True)
class Slots:
    """llama-server's ``/slots`` in two samples: the first before the canary, the
    second at the end of the sampling window (``busy_after``/``progressed`` are None
    when it could not be taken). ``progressed``: some slot's task, processing flag,
    decoded-token or processed-prompt-token count changed in between, which only the
    server's main loop does."""

    total: int
    busy: int
    busy_after: int | None = None
    progressed: bool | None = None

    @property
    def all_busy(self) -> bool:
        """Every slot was busy at the first sample (so no canary was sent)."""
        return self.total > 0 and self.busy >= self.total

    @property
    def free_at_last(self) -> bool:
        """The latest sample shows a free slot."""
        busy = self.busy if self.busy_after is None else self.busy_after
        return busy < self.total

    def to_fields(self) -> dict[str, object]:
        fields: dict[str, object] = {"total": self.total, "busy": self.busy}
        if self.busy_after is not None:
            fields["busy_after"] = self.busy_after
        if self.progressed is not None:
            fields["progressed"] = self.progressed
        return fields


@dataclass(frozen=True)
class Evidence:
    """What confirmation found out about a backend.

    ``cpu_seconds_delta``: user+system CPU time of the process and its children over
    the ``window_seconds`` sampling window, None when unknown. ``slots`` is None when
    the backend has no ``/slots`` or it could not be read (``slots_note`` says why).
    ``seconds``: how long the confirmation took.
    """

    process: ProcessStatus
    cpu_seconds_delta: float | None = None
    window_seconds: float = 0.0
    health: Probe = NOT_RUN_DECIDED
    slots: Slots | None = None
    slots_note: str = ""
    canary: Probe = NOT_RUN_DECIDED
    seconds: float = 0.0

    @property
    def cpu_advancing(self) -> bool:
        """The process used at least CPU_BUSY_FRACTION of a core over the window."""
        delta = self.cpu_seconds_delta
        if delta is None or self.window_seconds <= 0:
            return False
        return delta >= max(CPU_MIN_SECONDS, CPU_BUSY_FRACTION * self.window_seconds)

    @property
    def slots_progressed(self) -> bool:
        return self.slots is not None and self.slots.progressed is True

    @property
    def progressing(self) -> bool:
        """Progress was seen: in ``/slots``, or in CPU time."""
        return self.slots_progressed or self.cpu_advancing

    def to_fields(self) -> dict[str, object]:
        """A JSON-serialisable dict for the event log; unknown values are left out."""
        fields: dict[str, object] = {"process": self.process.value}
        if self.cpu_seconds_delta is not None:
            fields["cpu_seconds_delta"] = round(self.cpu_seconds_delta, 3)
        if self.window_seconds > 0:
            fields["window_seconds"] = round(self.window_seconds, 3)
        fields["health"] = self.health.to_fields()
        if self.slots is not None:
            fields["slots"] = self.slots.to_fields()
        if self.slots_note:
            fields["slots_note"] = self.slots_note
        fields["canary"] = self.canary.to_fields()
        fields["seconds"] = round(self.seconds, 3)
        return fields


class Rule(enum.Enum):
    """The rows of the decision table; the value is the stable id logged as ``rule``."""

    PROCESS_GONE = "process_gone"
    PROCESS_ZOMBIE = "process_zombie"
    PROCESS_STOPPED = "process_stopped"
    HEALTH_FAILED = "health_failed"
    CANARY_OK = "canary_ok"
    CANARY_ANSWERED = "canary_answered"
    BUSY_PROGRESSING = "busy_progressing"
    BUSY_WEDGED = "busy_wedged"
    CANARY_5XX = "canary_5xx"
    SATURATED_WITH_FREE_SLOT = "saturated_with_free_slot"
    SATURATED_PROGRESSING = "saturated_progressing"
    SATURATED_IDLE = "saturated_idle"
    UNANSWERED_PROGRESSING = "canary_unanswered_progressing"
    UNANSWERED_IDLE = "canary_unanswered_idle"
    NO_CANARY_PROGRESSING = "no_canary_progressing"
    NO_CANARY_FOR_TYPE_IDLE = "no_canary_for_type_idle"
    NO_CANARY_IDLE = "no_canary_idle"


@dataclass(frozen=True)
class Row:
    rule: Rule
    evidence: str
    restart: bool


PROGRESS = "progress (a slot moved, or CPU advancing)"
TABLE: Final[tuple[Row, ...]] = (
    Row(Rule.PROCESS_GONE, "the process is gone (or its pid is another process now)", True),
    Row(Rule.PROCESS_ZOMBIE, "the process is a zombie", True),
    Row(Rule.PROCESS_STOPPED, "the process is stopped (SIGSTOP, traced)", True),
    Row(Rule.HEALTH_FAILED, "`/health` not 200 in time (other status, timeout, refused)", True),
    Row(Rule.CANARY_OK, "canary answered 2xx", False),
    Row(
        Rule.CANARY_ANSWERED,
        "canary answered another status, no failure (400, 404...: not 408, 425, 429)",
        False,
    ),
    Row(Rule.BUSY_PROGRESSING, f"slots known, all busy; {PROGRESS}", False),
    Row(Rule.BUSY_WEDGED, "slots known, all busy; no progress", True),
    Row(Rule.CANARY_5XX, "canary answered 5xx", True),
    Row(
        Rule.SATURATED_WITH_FREE_SLOT,
        "canary answered 429/425; the last slots sample shows a free slot",
        True,
    ),
    Row(
        Rule.SATURATED_PROGRESSING, f"canary answered 429/425, no free slot seen; {PROGRESS}", False
    ),
    Row(Rule.SATURATED_IDLE, "canary answered 429/425, no free slot seen; no progress", True),
    Row(
        Rule.UNANSWERED_PROGRESSING, f"canary timed out, 408, refused or broken; {PROGRESS}", False
    ),
    Row(Rule.UNANSWERED_IDLE, "canary timed out, 408, refused or broken; no progress", True),
    Row(
        Rule.NO_CANARY_PROGRESSING,
        f"no canary (unsupported model type, no time left); {PROGRESS}",
        False,
    ),
    Row(
        Rule.NO_CANARY_FOR_TYPE_IDLE,
        "no canary for the model type (audio, images), `/health` answered; no progress",
        False,
    ),
    Row(Rule.NO_CANARY_IDLE, "no canary (no time left); no progress", True),
)
ROWS: Final = {row.rule: row for row in TABLE}


@dataclass(frozen=True)
class Decision:
    """Restart or not, by which rule, and why in words."""

    restart: bool
    rule: str
    reason: str


def _by(rule: Rule, reason: str) -> Decision:
    return Decision(ROWS[rule].restart, rule.value, reason)


def _progress(evidence: Evidence) -> str:
    seen = []
    if evidence.slots_progressed:
        seen.append("a slot moved")
    if evidence.cpu_advancing:
        seen.append(f"{evidence.cpu_seconds_delta:.2f}s CPU in {evidence.window_seconds:.2f}s")
    if seen:
        return " and ".join(seen)
    cpu = evidence.cpu_seconds_delta
    cpu_text = "CPU unknown" if cpu is None else f"{cpu:.2f}s CPU in {evidence.window_seconds:.2f}s"
    return f"no slot moved, {cpu_text}"


def _unanswered(probe: Probe) -> str:
    if probe.reply is Reply.FAILED:
        return f"answered {probe.status}"
    text: str = probe.reply.value.replace("_", " ")
    return f"{text} ({probe.detail})" if probe.detail else text


def _canary_class(canary: Probe) -> str:
    """``ok``, ``answered``, ``5xx``, ``saturated``, ``unanswered`` or ``not_run``."""
    status = canary.status
    if canary.reply is Reply.OK:
        return "ok"
    if canary.reply is Reply.NOT_RUN:
        return "not_run"
    if canary.reply is not Reply.FAILED or status is None or status == 408:
        return "unanswered"
    if 500 <= status <= 599:
        return "5xx"
    return "saturated" if status in SATURATED else "answered"


def judge(evidence: Evidence) -> Decision:
    """The first row of :data:`TABLE` that matches ``evidence``. Total: every
    evidence matches some row (the last two rows take whatever is left)."""
    process = evidence.process
    if process is ProcessStatus.GONE:
        return _by(Rule.PROCESS_GONE, "the process is gone")
    if process is ProcessStatus.ZOMBIE:
        return _by(Rule.PROCESS_ZOMBIE, "the process has exited (zombie)")
    if process is ProcessStatus.STOPPED:
        return _by(Rule.PROCESS_STOPPED, "the process is stopped and never scheduled")
    health = evidence.health
    if health.reply is not Reply.OK:
        return _by(Rule.HEALTH_FAILED, f"/health {_unanswered(health)}")
    canary, slots = evidence.canary, evidence.slots
    kind = _canary_class(canary)
    if kind == "ok":
        return _by(Rule.CANARY_OK, f"a one-token canary answered {canary.status}")
    if kind == "answered":
        return _by(Rule.CANARY_ANSWERED, f"a one-token canary answered {canary.status}")
    progressing, progress = evidence.progressing, _progress(evidence)
    if slots is not None and slots.all_busy:
        if progressing:
            return _by(Rule.BUSY_PROGRESSING, f"all {slots.total} slots busy; {progress}")
        return _by(Rule.BUSY_WEDGED, f"all {slots.total} slots busy; {progress}")
    if kind == "5xx":
        return _by(Rule.CANARY_5XX, f"a one-token canary answered {canary.status}")
    if kind == "saturated":
        answered = f"a one-token canary answered {canary.status}"
        if slots is not None and slots.free_at_last:
            return _by(Rule.SATURATED_WITH_FREE_SLOT, f"{answered} with a slot free")
        if progressing:
            return _by(Rule.SATURATED_PROGRESSING, f"{answered}, but {progress}")
        return _by(Rule.SATURATED_IDLE, f"{answered}; {progress}")
    if kind == "unanswered":
        what = f"the canary {_unanswered(canary)}"
        if progressing:
            return _by(Rule.UNANSWERED_PROGRESSING, f"{what}, but {progress}")
        return _by(Rule.UNANSWERED_IDLE, f"{what}; {progress}")
    why = canary.not_run.value if canary.not_run is not None else "not run"
    if progressing:
        return _by(Rule.NO_CANARY_PROGRESSING, f"no canary ({why}), but {progress}")
    if canary.not_run is NotRun.UNSUPPORTED:
        # Nothing here tells a wedge from an idle healthy backend, and the trip may be a
        # forged request file: a backend that answers /health is left alone.
        return _by(Rule.NO_CANARY_FOR_TYPE_IDLE, f"no canary ({why}); {progress}")
    return _by(Rule.NO_CANARY_IDLE, f"no canary ({why}); {progress}")


def table_markdown() -> str:
    """:data:`TABLE` as docs/watchdog.md's markdown table (kept equal to it by a test)."""
    lines = ["| # | Evidence | Decision | `rule` |", "|---|---|---|---|"]
    for number, row in enumerate(TABLE, 1):
        decision = "restart" if row.restart else "not confirmed"
        lines.append(f"| {number} | {row.evidence} | {decision} | `{row.rule.value}` |")
    return "\n".join(lines) + "\n"
