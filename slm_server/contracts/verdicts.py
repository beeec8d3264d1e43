"""What one proxied outcome says about a backend's health. Pure.

Statuses are sorted into three verdicts rather than split at 500, because a 4xx can
describe the backend (429 saturated, 408 timed out) as well as the caller:

    health   2xx, 400, 404, 422          resets the model's failure streak
    failure  408, 425, 429, every 5xx,   counts toward a restart
             refused connections, backend timeouts, broken connections
    ignore   every other status,         neither counts nor resets: an unknown code
             a deadline that cut an      is not evidence of health, and a cut answer
             answer still arriving       is the client's budget running out

A first-byte stall on a streaming request is a failure that trips at once. Which
deadlines are backend timeouts is :func:`deadline_outcome`'s rule.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final

from slm_server.errors import AnswerTooLarge, BackendTimeout, BackendUnavailable, GatewayError

HEALTH_STATUSES = frozenset({400, 404, 422})
FAILURE_4XX = {408: "timeout", 425: "saturated", 429: "saturated"}


class Verdict(enum.Enum):
    HEALTH = "health"
    FAILURE = "failure"
    IGNORE = "ignore"


class FailureClass(enum.Enum):
    """The kinds of failure; a trip needs N consecutive failures of one kind."""

    UNREACHABLE = "unreachable"
    TIMEOUT = "timeout"
    SERVER_ERROR = "5xx"
    SATURATED = "saturated"
    BROKEN = "broken_connection"
    STALL = "stall"


NOT_IMPLEMENTED = 501


@dataclass(frozen=True)
class Outcome:
    """A classified outcome: the verdict, and for failures their class."""

    verdict: Verdict
    failure: FailureClass | None = None
    status: int | None = None

    @property
    def reason(self) -> str:
        if self.failure is not None:
            return self.failure.value
        return self.verdict.value


def classify_status(status: int) -> Outcome:
    """The verdict on a status code the backend answered with. A 501 (the engine has no
    such feature: a model without fill-in-the-middle tokens asked to fill in) says what
    the engine can do, not how it is: neither counts nor resets."""
    if 200 <= status < 300 or status in HEALTH_STATUSES:
        return Outcome(Verdict.HEALTH, status=status)
    if status == NOT_IMPLEMENTED:
        return Outcome(Verdict.IGNORE, status=status)
    if 500 <= status <= 599:
        return Outcome(Verdict.FAILURE, FailureClass.SERVER_ERROR, status)
    if status in FAILURE_4XX:
        kind = FailureClass.TIMEOUT if status == 408 else FailureClass.SATURATED
        return Outcome(Verdict.FAILURE, kind, status)
    return Outcome(Verdict.IGNORE, status=status)


# What llama-server says, with a 500, of an input longer than its batch or its context
# (server-context.cpp, an embedding or rerank request that cannot be split): the size
# of what the client sent, not the engine's health.
INPUT_TOO_LARGE: Final = (b"is too large to process", b"is larger than the max context size")


def judged_answer(outcome: Outcome, content: bytes) -> Outcome:
    """``outcome`` (of the answer's status), unless the answer is an engine's 500 that
    says the client's input is too large for it: that neither counts nor resets."""
    if outcome.status == 500 and any(content.find(mark) >= 0 for mark in INPUT_TOO_LARGE):
        return Outcome(Verdict.IGNORE, status=500)
    return outcome


def classify_engine_status(status: int) -> Outcome:
    """The verdict on a status the engine answered a request relayed as the client
    wrote it (``/upstream/<model>/<path>``), whose path and body the router never
    checked: none, whatever it is. A 5xx may be the engine's answer to a malformed
    body (llama-server answers one with 500), and a 200 may come from a path its HTTP
    thread answers while generation is wedged (``/health``), which must not reset a
    streak the model's own routes are building."""
    return Outcome(Verdict.IGNORE, status=status)


HEALTHY = Outcome(Verdict.HEALTH)
UNREACHABLE = Outcome(Verdict.FAILURE, FailureClass.UNREACHABLE)
TIMED_OUT = Outcome(Verdict.FAILURE, FailureClass.TIMEOUT)
BROKEN = Outcome(Verdict.FAILURE, FailureClass.BROKEN)
STALLED = Outcome(Verdict.FAILURE, FailureClass.STALL)
# The model's own deadline cut an answer the backend was still delivering.
PROGRESSING = Outcome(Verdict.IGNORE)


# A cut with nothing of the answer counts only once the backend has had the request for
# this share of the model's deadline (or for the stall threshold, if that is shorter):
# a request whose deadline the router's own queue used up says nothing of the backend.
NOTHING_YET_SHARE = 0.5


def deadline_outcome(
    silence: float, delivered: bool, stall_seconds: float, deadline_seconds: float
) -> Outcome:
    """The verdict on a request that the model's own deadline cut.

    ``silence`` is how long the router had been waiting on the backend with nothing
    arriving when the deadline passed: since the last byte of the body, or since the
    request was sent when ``delivered`` is false (no byte of the body came); 0 when it
    was not waiting on the backend at all. ``deadline_seconds`` is the model's deadline.
    The cut is a backend timeout when the backend had delivered something and then
    nothing for at least ``stall_seconds``, or had delivered nothing in at least
    :func:`nothing_yet_seconds`; otherwise the backend was making progress (or never had
    a fair chance) and the deadline was only the client's budget.
    """
    needed = stall_seconds if delivered else nothing_yet_seconds(stall_seconds, deadline_seconds)
    return TIMED_OUT if silence >= needed else PROGRESSING


def nothing_yet_seconds(stall_seconds: float, deadline_seconds: float) -> float:
    """How long a backend must have had a request, with nothing of the answer back, for
    a deadline cut to count: the stall threshold or half the deadline, the shorter."""
    return min(stall_seconds, deadline_seconds * NOTHING_YET_SHARE)


def outcome_of(error: GatewayError) -> Outcome:
    """The watchdog's verdict on a transport failure talking to a backend. An answer
    past the router's own size limits says nothing of the backend's health."""
    if isinstance(error, AnswerTooLarge):
        return Outcome(Verdict.IGNORE)
    if isinstance(error, BackendTimeout):
        return TIMED_OUT
    if isinstance(error, BackendUnavailable):
        return UNREACHABLE
    return BROKEN
