"""The router's half of the watchdog: judge every proxied outcome, keep failure
streaks, arm first-byte stall timers on streams, and on a trip write a restart request
for the supervisor. Failure and ignore verdicts are logged; health is not (it would be
every successful request).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from slm_server.config import ModelSpec
from slm_server.settings import WatchdogSettings
from slm_server.supervise.classify import STALLED, Outcome, Verdict
from slm_server.supervise.events import EventLog
from slm_server.supervise.requests import RestartRequest, write_request
from slm_server.supervise.streaks import Streaks, Trip

log = logging.getLogger("slm_server.watchdog")


class StallTimer:
    """Trips the watchdog unless ``first_byte()`` or ``cancel()`` comes in time."""

    def __init__(self, handle: asyncio.TimerHandle | None) -> None:
        self._handle = handle

    def first_byte(self) -> None:
        self.cancel()

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


class Tripwire:
    """Classified outcomes in, restart requests out."""

    def __init__(
        self,
        settings: WatchdogSettings,
        events: EventLog,
        wall: Callable[[], float] = time.time,
        on_failure: Callable[[ModelSpec, Outcome], None] | None = None,
    ) -> None:
        self.settings = settings
        self.events = events
        self.wall = wall
        self.on_failure = on_failure  # hears every failure verdict (the metrics count them)
        self.streaks = Streaks(settings.failure_threshold)

    def observe(self, spec: ModelSpec, outcome: Outcome, detail: str | None = None) -> None:
        """Fold one outcome of a request to ``spec``'s backend into its streak."""
        if not self.settings.enabled:
            return
        ids = {"role": spec.role, "model_id": spec.entry.id, "port": spec.entry.port}
        if outcome.verdict is Verdict.IGNORE:
            self.events.emit("unclassified_status", **ids, status=outcome.status)
            return
        trip = self.streaks.record(spec.role, outcome)
        if outcome.verdict is Verdict.FAILURE and outcome.failure is not None:
            if self.on_failure is not None:
                self.on_failure(spec, outcome)
            streak = (
                trip.count if trip is not None else self.streaks.count(spec.role, outcome.failure)
            )
            self.events.emit(
                "backend_failure",
                **ids,
                reason=outcome.reason,
                status=outcome.status,
                streak=streak,
                detail=detail,
            )
        if trip is not None:
            self.trip(spec, trip, detail)

    def trip(self, spec: ModelSpec, trip: Trip, detail: str | None) -> None:
        request = RestartRequest(
            role=spec.role,
            model_id=spec.entry.id,
            port=spec.entry.port,
            reason=trip.failure.value,
            requested_at=self.wall(),
            detail=detail,
        )
        try:
            path = write_request(self.settings.request_dir, request)
        except OSError as exc:
            log.error("cannot write a restart request for %s: %s", spec.entry.id, exc)
            return
        self.events.emit(
            "restart_requested",
            role=spec.role,
            model_id=spec.entry.id,
            port=spec.entry.port,
            reason=trip.failure.value,
            streak=trip.count,
            file=path.name,
            detail=detail,
        )

    def stall_timer(self, spec: ModelSpec) -> StallTimer:
        """Arm a first-byte timer for a streaming request to ``spec`` (call from the
        event loop); it records a stall when it fires."""
        if not self.settings.enabled:
            return StallTimer(None)
        seconds = self.settings.stall_seconds
        detail = f"no first byte within {seconds:g}s on a streaming request"
        loop = asyncio.get_running_loop()
        handle = loop.call_later(seconds, self.observe, spec, STALLED, detail)
        return StallTimer(handle)

    def open_streak(self, role: str) -> int:
        return self.streaks.open(role)
