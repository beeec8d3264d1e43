"""One file's download as the rest of a pull sees it: each chunk is counted, checked
against a stall and a cancel, and reported at most every :data:`REPORT_SECONDS`."""

from __future__ import annotations

import threading
from collections.abc import Callable

from slm_server.pull.errors import PullError
from slm_server.pull.events import Progress, Report
from slm_server.pull.meter import Meter
from slm_server.settings import PullSettings

REPORT_SECONDS = 0.2


class Transfer:
    def __init__(
        self,
        name: str,
        total: int | None,
        resumed: int,
        settings: PullSettings,
        report: Report,
        cancel: threading.Event | None,
        clock: Callable[[], float],
    ) -> None:
        self.name = name
        self._report = report
        self._cancel = cancel
        self._clock = clock
        self.meter = Meter(
            total,
            clock(),
            resumed,
            settings.stall_seconds,
            settings.min_bytes_per_second,
        )
        self._reported = float("-inf")
        self._from_network = False
        self._emit(self.meter.started)

    def _emit(self, now: float) -> None:
        self._reported = now
        m = self.meter
        self._report(
            Progress(
                self.name,
                m.done,
                m.total,
                m.resumed,
                m.bytes_per_second(now),
                m.seconds_left(now),
            )
        )

    def check(self) -> None:
        """Raise when the pull was cancelled or the transfer has stalled."""
        if self._cancel is not None and self._cancel.is_set():
            raise PullError("cancelled", f"{self.name}: cancelled (what arrived is kept to resume)")
        now = self._clock()
        if self.meter.stalled(now):
            rate = self.meter.min_bytes_per_second
            raise PullError(
                "stalled",
                f"{self.name}: less than {rate} bytes a second for "
                f"{self.meter.stall_seconds:g} s (SLM_PULL_STALL_SECONDS); what arrived is "
                "kept, and the next pull resumes from it",
            )

    def advance(self, n: int) -> None:
        """``n`` more bytes, as the downloader reports them; ignored once the bytes
        are counted off the network (:meth:`advance_from_network`), which sees them
        first and in smaller pieces."""
        if not self._from_network:
            self._count(n)

    def advance_from_network(self, n: int) -> None:
        self._from_network = True
        self._count(n)

    def _count(self, n: int) -> None:
        now = self._clock()
        self.meter.advance(n, now)
        if now - self._reported >= REPORT_SECONDS:
            self._emit(now)
        self.check()

    def restart(self) -> None:
        """The hub ignored the resume and sends the whole file again."""
        self.meter = Meter(
            self.meter.total,
            self._clock(),
            0,
            self.meter.stall_seconds,
            self.meter.min_bytes_per_second,
        )

    def finish(self) -> None:
        self._emit(self._clock())


__all__ = ["REPORT_SECONDS", "Transfer"]
