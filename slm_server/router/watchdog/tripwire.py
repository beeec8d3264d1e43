"""The router's half of the watchdog: judge every proxied outcome, keep failure
streaks, time the silence of every stream (from its first byte, or throughout where the
engine reports its prompt progress), judge the deadlines that cut requests
by what the backend had delivered, and on a trip write a restart request for the
supervisor. Failure and ignore verdicts are logged; health is not (it would be every
successful request).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from slm_server.contracts.events import EventSink
from slm_server.contracts.restart_requests import RestartRequest, write_request
from slm_server.contracts.verdicts import (
    STALLED,
    Outcome,
    Verdict,
    deadline_outcome,
    nothing_yet_seconds,
)
from slm_server.registry.schema import ModelSpec
from slm_server.router.call.waits import running_loop
from slm_server.router.watchdog.streaks import Streaks, Trip
from slm_server.settings import WatchdogSettings

log = logging.getLogger("slm_server.watchdog")


class StallTimer:
    """Trips the watchdog when a stream's backend stays silent too long.

    As a first-byte timer (no ``watch``) it trips unless ``first_byte()`` or
    ``cancel()`` comes within ``seconds``. Given the call's :class:`Progress` to watch
    (an engine asked for its prompt progress, whose every report is a sign of life), it
    measures silence instead, from sending to the end of the stream: when it fires it
    looks at how long the backend has been silent and, short of ``seconds``, sets
    itself again for the rest (no timer per chunk). ``pause()`` stops it while the
    router, not the backend, holds the answer up, and ``resume()`` arms it afresh. It
    trips at most once; without a loop it never runs (the watchdog is off)."""

    __slots__ = ("_handle", "_loop", "_on_stall", "_paused", "_seconds", "watch")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop | None = None,
        seconds: float = 0.0,
        on_stall: Callable[[], None] | None = None,
        watch: Progress | None = None,
    ) -> None:
        self._loop = loop
        self._seconds = seconds
        self._on_stall = on_stall
        self.watch = watch
        self._handle: asyncio.TimerHandle | None = None
        self._paused = False
        self._arm(seconds)

    def _arm(self, delay: float) -> None:
        if self._loop is not None:
            self._handle = self._loop.call_later(delay, self._fire)

    def _fire(self) -> None:
        self._handle = None
        watch = self.watch
        if watch is not None:
            left = self._seconds - watch.silence(time.perf_counter())
            if left > 0:
                self._arm(max(left, MIN_REARM_SECONDS))
                return
        if self._on_stall is not None:
            self._on_stall()

    def first_byte(self) -> None:
        """The stream's first byte: a first-byte timer is done; silence is still timed."""
        if self.watch is None:
            self.cancel()

    def cancel(self) -> None:
        self._paused = False
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def pause(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
            self._paused = True

    def resume(self) -> None:
        if self._paused:
            self._paused = False
            self._arm(self._seconds)


# A silence timer that fires a hair early (two clocks) waits at least this long again.
MIN_REARM_SECONDS = 0.001


class Progress:
    """What the backend has delivered on one request so far, kept by whatever reads its
    answer: made as the request is sent, ``waiting(now)`` as the reader starts waiting
    for more bytes, ``arrived()`` when some came. Times are the reader's clock
    (``time.perf_counter()`` in the router); ``reports`` says the engine reports its
    prompt progress."""

    __slots__ = ("delivered", "held", "reports", "sent_at", "waiting_since")

    def __init__(self, sent_at: float, reports: bool = False) -> None:
        self.sent_at = sent_at
        # The engine was asked to report its prompt progress: a report is a sign of
        # life like a token, and silence is judged by the silence limit throughout.
        self.reports = reports
        self.delivered = False
        self.waiting_since: float | None = None
        self.held = False

    def hold(self) -> None:
        """The client holds the answer up (its head cannot go out to it): no silence
        is the backend's until :meth:`go_on`."""
        self.held = True

    def go_on(self, now: float) -> None:
        """The router waits on the backend again, for its first byte, from ``now``."""
        self.held = False
        self.sent_at = now

    def waiting(self, now: float) -> None:
        self.waiting_since = now

    def arrived(self) -> None:
        self.delivered = True
        self.waiting_since = None

    def came(self, now: float) -> None:
        """Bytes arrived and were dealt with: the reader waits for more from ``now``."""
        self.delivered = True
        self.waiting_since = now

    def silence(self, now: float) -> float:
        """How long the reader has been waiting with nothing arriving: since the request
        was sent while no byte of the body has come; else since the last bytes, 0 when
        it is not waiting on the backend at all (the router, or a client slow to read,
        holds the answer up, not the backend)."""
        if self.held:
            return 0.0
        if not self.delivered:
            return max(0.0, now - self.sent_at)
        since = self.waiting_since
        return 0.0 if since is None else max(0.0, now - since)


class Tripwire:
    """Classified outcomes in, restart requests out."""

    def __init__(
        self,
        settings: WatchdogSettings,
        events: EventSink,
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

    def deadline(self, spec: ModelSpec, progress: Progress, now: float, detail: str) -> Outcome:
        """Judge a request the model's own deadline cut, from what ``progress`` saw up to
        ``now``: a backend timeout is observed as one; a cut while the backend was still
        delivering, or before it had a fair chance, counts for nothing and is logged as
        ``deadline_not_counted``."""
        silence = progress.silence(now)
        deadline = float(spec.entry.default_timeout)
        stall = self.stall_limit(progress)
        outcome = deadline_outcome(silence, progress.delivered, stall, deadline)
        if outcome.verdict is Verdict.FAILURE:
            if progress.delivered:
                detail = f"{detail}; nothing from the backend for {silence:.3g}s"
            self.observe(spec, outcome, detail)
        elif self.settings.enabled:
            self.events.emit(
                "deadline_not_counted",
                role=spec.role,
                model_id=spec.entry.id,
                port=spec.entry.port,
                delivered=progress.delivered,
                silent_seconds=round(silence, 3),
                needed_seconds=stall
                if progress.delivered
                else nothing_yet_seconds(stall, deadline),
                stall_seconds=stall,
                detail=detail,
            )
        return outcome

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

    def stall_limit(self, progress: Progress | None) -> float:
        """The silence that counts against the backend on a request: the silence limit
        where the engine reports its progress, else the first-byte stall limit."""
        settings = self.settings
        reports = progress is not None and progress.reports
        return settings.silence_seconds if reports else settings.stall_seconds

    def stall_timer(self, spec: ModelSpec, watch: Progress | None = None) -> StallTimer:
        """Arm a stall timer for a streaming request to ``spec`` (call from the event
        loop): a silence timer over ``watch`` when the engine reports its progress, else
        a first-byte timer; it records a stall when it fires."""
        if not self.settings.enabled:
            return StallTimer(watch=watch)
        seconds = self.stall_limit(watch)
        if watch is not None and watch.reports:
            detail = (
                f"nothing from the backend for {seconds:g}s on a streaming request "
                "(no prompt progress, no token)"
            )
        else:
            detail = f"no first byte within {seconds:g}s on a streaming request"

        def stalled() -> None:
            self.observe(spec, STALLED, detail)

        if watch is not None and watch.reports:
            return StallTimer(running_loop(), seconds, stalled, watch)
        return StallTimer(running_loop(), seconds, stalled)

    def open_streak(self, role: str) -> int:
        return self.streaks.open(role)
