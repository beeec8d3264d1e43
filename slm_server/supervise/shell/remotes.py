"""The supervisor's remotes: entries with ``backend: remote``, for which nothing is
started and nothing can be restarted. The shell of :mod:`slm_server.supervise.core.eject`.

The router trips on a remote as on any backend and writes its restart request; the
supervisor hands a request naming a remote here instead of to :func:`decide`. Each
is confirmed against the remote (its model list and a one-token canary, with its
key); a confirmed trip counts towards ejection, an unconfirmed one is logged as
``restart_not_confirmed`` and changes nothing. An ejected remote is published as
``ejected`` with ``ejected_until`` in the state file, which the router reads to keep
traffic off it; once the ejection is over it is probed again, and re-admitted
(``remote_readmitted``) when the probe shows it healthy, or ejected for longer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any

from slm_server.contracts.events import EventSink
from slm_server.contracts.records import BackendState
from slm_server.contracts.restart_requests import RestartRequest
from slm_server.registry import remote
from slm_server.registry.schema import ModelSpec
from slm_server.settings import WatchdogSettings
from slm_server.supervise.core.confirm import Decision
from slm_server.supervise.core.eject import Change, Ejection, EjectionPolicy, judge
from slm_server.supervise.shell.control import ProcessControl

log = logging.getLogger("slm_server.supervisor")


class Remote:
    """One remote entry and its standing."""

    def __init__(self, spec: ModelSpec, policy: EjectionPolicy, since: float) -> None:
        self.spec = spec
        self.ejection = Ejection(policy)
        self.since = since  # wall clock of the last change of standing
        self.confirming = False  # a trip's confirmation is out
        self.evidence: dict[str, object] = {}  # the last confirmation's probes
        self.stopped = False  # the supervisor is gone: nobody judges it any more

    def ids(self) -> dict[str, object]:
        entry = self.spec.entry
        return {"role": self.spec.role, "model_id": entry.id, "url": remote.shown_url(entry)}

    def snapshot(self, now: float, wall: float) -> BackendState:
        """What the state file publishes: no pid, no log, no restart budget."""
        entry, ejection = self.spec.entry, self.ejection
        until = ejection.until
        return BackendState(
            role=self.spec.role,
            model_id=entry.id,
            backend=entry.backend,
            port=entry.port,
            state="stopped" if self.stopped else ejection.standing.value,
            pid=None,
            since=self.since,
            started_at=None,
            exit_status=None,
            restarts=0,
            reason=ejection.reason,
            log_path="",
            kind="remote",
            health_path=remote.probe_path(entry),
            load=entry.load,
            url=remote.shown_url(entry),
            ejected_until=round(wall + (until - now), 3) if until is not None else None,
            ejections=ejection.ejections,
        )


def _verdict(found: Remote, request: RestartRequest, decision: Decision) -> dict[str, Any]:
    """The fields every event about a confirmed or unconfirmed trip carries."""
    return {
        **found.ids(),
        "reason": request.reason,
        "rule": decision.rule,
        "why": decision.reason,
        "evidence": found.evidence,
    }


class Remotes:
    """Every enabled remote of one registry, judged by the router's trips."""

    def __init__(
        self,
        specs: list[ModelSpec],
        watchdog: WatchdogSettings,
        control: ProcessControl,
        events: EventSink,
        clock: Callable[[], float],
        wall: Callable[[], float],
        spawn: Callable[[Coroutine[Any, Any, None]], None],
    ) -> None:
        policy = EjectionPolicy(
            watchdog.remote_eject_base_seconds,
            watchdog.remote_eject_max_seconds,
            watchdog.remote_eject_after,
        )
        self.policy = policy
        self.by_role = {spec.role: Remote(spec, policy, wall()) for spec in specs}
        self.confirm_seconds = watchdog.confirm_seconds
        self.control = control
        self.events = events
        self.clock = clock
        self.wall = wall
        self.spawn = spawn
        self.dirty = False  # a standing changed since the last publication

    def replace(self, specs: list[ModelSpec], keep: set[str]) -> None:
        """A reload's remotes: those in ``keep`` (same url, key and model) keep their
        standing with their new entry; the others start afresh; the rest are gone."""
        by_role: dict[str, Remote] = {}
        for spec in specs:
            found = self.by_role.get(spec.role)
            if found is not None and spec.role in keep:
                found.spec = spec
            else:
                found = Remote(spec, self.policy, self.wall())
            by_role[spec.role] = found
        self.by_role = by_role
        self.dirty = True

    def __contains__(self, role: object) -> bool:
        return role in self.by_role

    def snapshots(self, now: float, wall: float) -> list[BackendState]:
        return [r.snapshot(now, wall) for r in self.by_role.values()]

    def stop(self) -> None:
        """Published ``stopped`` on shutdown, as the local backends are."""
        for found in self.by_role.values():
            found.stopped = True
            found.since = self.wall()

    def trip(self, request: RestartRequest) -> None:
        """The router's trip on a remote: confirmed against it before it counts. A
        request that does not name the remote as the registry does is discarded."""
        found = self.by_role[request.role]
        entry = found.spec.entry
        if request.model_id != entry.id or request.port != entry.port:
            self.events.emit(
                "stale_request_discarded",
                **found.ids(),
                requested_reason=request.reason,
                why="the request does not name this remote (model id or port differ)",
            )
            return
        if found.ejection.ejected or found.confirming:
            return  # ejected already, or this trip's twin is being confirmed
        found.confirming = True
        self.spawn(self._confirm(found, request))

    def tick(self) -> None:
        """Probe each remote whose ejection is over."""
        now = self.clock()
        for found in self.by_role.values():
            if found.ejection.due(now):
                found.ejection.probing = True
                self.spawn(self._readmit(found))

    async def _judge(self, found: Remote) -> Decision:
        try:
            models, canary = await self.control.probe_remote(found.spec.entry, self.confirm_seconds)
        except Exception as exc:
            # A bug here must never eject a remote that may well be healthy.
            log.exception("confirmation of remote %s failed", found.spec.entry.id)
            return Decision(False, "confirmation_failed", str(exc))
        decision = judge(models, canary)
        found.evidence = {"models": models.to_fields(), "canary": canary.to_fields()}
        return decision

    async def _confirm(self, found: Remote, request: RestartRequest) -> None:
        try:
            decision = await self._judge(found)
        finally:
            found.confirming = False
        ejection = found.ejection
        if not decision.restart:
            ejection.not_confirmed()
            self.events.emit("restart_not_confirmed", **_verdict(found, request, decision))
            return
        change = ejection.confirmed(self.clock(), f"{request.reason}: {decision.reason}")
        if change.event is None:
            self.events.emit(
                "restart_confirmed",
                **_verdict(found, request, decision),
                action="counted towards ejection",
                consecutive=ejection.consecutive,
            )
            return
        self._publish(found, change, decision)

    async def _readmit(self, found: Remote) -> None:
        decision = await self._judge(found)
        change = found.ejection.probed(self.clock(), not decision.restart, decision.reason)
        self._publish(found, change, decision)

    def _publish(self, found: Remote, change: Change, decision: Decision) -> None:
        if change.event is None:
            return
        ejection = found.ejection
        found.since = self.wall()
        self.dirty = True
        if change.event == "remote_ejected":
            log.warning(
                "remote %s ejected for %gs: %s", found.spec.role, change.seconds, ejection.reason
            )
            self.events.emit(
                "remote_ejected",
                **found.ids(),
                reason=ejection.reason,
                rule=decision.rule,
                seconds=change.seconds,
                ejections=ejection.ejections,
                evidence=found.evidence,
            )
        else:
            log.info("remote %s re-admitted: %s", found.spec.role, decision.reason)
            self.events.emit(
                "remote_readmitted",
                **found.ids(),
                rule=decision.rule,
                why=decision.reason,
                ejections=ejection.ejections,
                evidence=found.evidence,
            )
