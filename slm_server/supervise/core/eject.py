"""Ejection of remote engines, the watchdog's answer where it cannot restart. Pure.

A remote (``backend: remote``) runs on another host: the supervisor starts nothing for
it and can restart nothing. It is judged like a local backend (the router's streaks of
5xx, timeouts and stalls trip; 4xx never count) and a trip is confirmed against the
remote itself (:func:`judge`, on an active probe). Then, like Envoy's outlier
detection:

    admitted --(``after`` confirmed trips in a row)--> ejected until now + duration
    ejected  --(the time is up, a probe answers healthy)--> admitted
    ejected  --(the time is up, the probe fails)--> ejected again, for longer

The n-th ejection in a row lasts ``base_seconds * 2**(n-1)``, at most ``max_seconds``;
the count is forgotten once the remote has been admitted for ``max_seconds`` without
a confirmed failure. A trip the remote's own answers do not confirm resets the
consecutive count and changes nothing else: a forged request, or a client whose
requests fail for their own reasons, cannot eject a remote that answers.

The confirmation's probes and their verdict (:func:`judge`)::

    GET {url}/models: 5xx, 408, timed out, refused or broken ......... eject
    one-token canary answered 2xx ..................................... not confirmed
    canary answered 4xx but 408 (400, 401, 404, 429: the remote is up) . not confirmed
    canary answered 5xx ............................................... eject
    canary 408, timed out, refused or broken .......................... eject
    no canary (a model type without one): the model list answered ..... not confirmed
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from slm_server.supervise.core.confirm import Decision, Probe, Reply


class Standing(enum.Enum):
    """Whether the router may send the remote traffic."""

    ADMITTED = "ready"
    EJECTED = "ejected"


@dataclass(frozen=True)
class EjectionPolicy:
    """``SLM_REMOTE_EJECT_*``: the first ejection's length, the longest one, and how
    many confirmed trips in a row eject."""

    base_seconds: float = 30.0
    max_seconds: float = 300.0
    after: int = 1

    def duration(self, ejections: int) -> float:
        """How long the ``ejections``-th ejection in a row lasts (1 is the first)."""
        return float(min(self.max_seconds, self.base_seconds * 2 ** max(0, ejections - 1)))


@dataclass(frozen=True)
class Change:
    """What a turn of :class:`Ejection` did: ``event`` is ``remote_ejected`` or
    ``remote_readmitted`` (None: nothing to publish), with the ejection's length."""

    event: str | None
    seconds: float = 0.0


NOTHING = Change(None)


class Ejection:
    """One remote's standing, driven by confirmed and unconfirmed trips and probes
    (every call takes the monotonic ``now``)."""

    def __init__(self, policy: EjectionPolicy) -> None:
        self.policy = policy
        self.standing = Standing.ADMITTED
        self.consecutive = 0  # confirmed trips in a row while admitted
        self.ejections = 0  # ejections in a row, doubling the next one's length
        self.until: float | None = None  # monotonic end of the ejection
        self.admitted_at: float | None = None  # monotonic, since the last re-admission
        self.reason: str | None = None
        self.probing = False  # a re-admission probe is out

    @property
    def ejected(self) -> bool:
        return self.standing is Standing.EJECTED

    def confirmed(self, now: float, reason: str) -> Change:
        """A trip the remote's own answers confirmed; ejects at the ``after``-th in a row."""
        if self.ejected:
            return NOTHING
        self._forget_old(now)
        self.consecutive += 1
        if self.consecutive < self.policy.after:
            return NOTHING
        return self._eject(now, reason)

    def not_confirmed(self) -> None:
        """A trip the remote's answers did not confirm: the run of failures is broken."""
        self.consecutive = 0

    def due(self, now: float) -> bool:
        """Whether a re-admission probe should go out now."""
        return self.ejected and not self.probing and self.until is not None and now >= self.until

    def probed(self, now: float, healthy: bool, reason: str) -> Change:
        """The re-admission probe's verdict: admitted again, or ejected for longer."""
        self.probing = False
        if not self.ejected:
            return NOTHING
        if not healthy:
            return self._eject(now, f"re-admission probe failed: {reason}")
        self.standing = Standing.ADMITTED
        self.until = None
        self.consecutive = 0
        self.admitted_at = now
        self.reason = None
        return Change("remote_readmitted")

    def _eject(self, now: float, reason: str) -> Change:
        self.ejections += 1
        seconds = self.policy.duration(self.ejections)
        self.standing = Standing.EJECTED
        self.until = now + seconds
        self.consecutive = 0
        self.reason = reason
        return Change("remote_ejected", seconds)

    def _forget_old(self, now: float) -> None:
        """Ejections are forgotten after ``max_seconds`` admitted without one."""
        since = self.admitted_at
        if since is not None and now - since >= self.policy.max_seconds:
            self.ejections = 0
            self.admitted_at = None


def _failed(probe: Probe) -> bool:
    """The probe shows a broken server: 5xx, 408, or no HTTP answer at all."""
    if probe.reply is Reply.OK or probe.reply is Reply.NOT_RUN:
        return False
    if probe.reply is not Reply.FAILED or probe.status is None:
        return True
    return probe.status >= 500 or probe.status == 408


def _said(probe: Probe) -> str:
    if probe.status is not None:
        return f"answered {probe.status}"
    text = probe.reply.value.replace("_", " ")
    return f"{text} ({probe.detail})" if probe.detail else text


def judge(models: Probe, canary: Probe) -> Decision:
    """Eject or not (``restart`` is "eject"), on the model list and the canary."""
    if _failed(models):
        return Decision(True, "remote_probe_failed", f"GET models {_said(models)}")
    if canary.reply is Reply.NOT_RUN:
        return Decision(False, "remote_probe_answered", f"GET models {_said(models)}")
    if not _failed(canary):
        rule = "canary_ok" if canary.reply is Reply.OK else "canary_answered"
        return Decision(False, rule, f"a one-token canary {_said(canary)}")
    if canary.status is not None and canary.status >= 500:
        return Decision(True, "canary_5xx", f"a one-token canary {_said(canary)}")
    return Decision(True, "canary_unanswered", f"the canary {_said(canary)}")
