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
        limit: int | None = None,
    ) -> None:
        self.name = name
        self._limit = limit  # more bytes than this: the hub lied about the size
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
        self._reported_bytes = 0
        self._network_bytes = 0
        self._counted = 0
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
        """``n`` more bytes, as the downloader reports them."""
        self._reported_bytes += n
        self._count()

    def advance_from_network(self, n: int) -> None:
        """``n`` more bytes read off the network in this thread. An HTTP download is
        seen here first and in smaller pieces than its downloader reports; a download
        through another client (Hugging Face's Xet) is only reported. The transfer
        counts whichever of the two is ahead, so neither is counted twice."""
        self._network_bytes += n
        self._count()

    def _count(self) -> None:
        ahead = max(self._reported_bytes, self._network_bytes)
        if self._limit is not None and self.meter.resumed + ahead > self._limit:
            raise PullError(
                "checksum",
                f"{self.name}: more bytes than the hub's {self._limit}; stopped, not kept",
            )
        n = ahead - self._counted
        if n > 0:
            self._counted = ahead
            now = self._clock()
            self.meter.advance(n, now)
            if now - self._reported >= REPORT_SECONDS:
                self._emit(now)
        self.check()

    def restart(self) -> None:
        """The hub ignored the resume and sends the whole file again."""
        self._reported_bytes = self._network_bytes = self._counted = 0
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
