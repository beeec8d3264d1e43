"""A backend's event stream spliced to the client: each piece the upstream parser
delivers is checked by the stream's :class:`~slm_server.router.upstream.sse.SseTap` and written
to the client's connection in the same callback, with no task woken, no async
generator resumed and no ASGI message built per piece.

It keeps every duty of the piece-by-piece relay it stands in for
(:meth:`~slm_server.router.upstream.sender.Sender.watched` under the tap): the first piece
clears the stall timer and counts as health, each one is noted in the call's
:class:`~slm_server.router.watchdog.tripwire.Progress` and
:class:`~slm_server.router.call.exchange.Exchange`, a broken body counts against the
backend, a stream event past its limit ends the stream, and the read timeout bounds
every wait for the next bytes. A client that reads slower than the backend writes
pauses the backend's socket until the client's buffer drains (the router holds the
answer up then, not the backend). Used when both sides of the fast path
(:mod:`slm_server.router.call.fast_path`) offer theirs: the server a
:class:`~slm_server.router.call.fast_path.PieceWriter` for the client, the upstream
response a :class:`~slm_server.router.call.fast_path.SpliceSource` (the router's own
HTTP client's does); otherwise the relay reads the stream piece by piece as before.
"""

from __future__ import annotations

import asyncio
import time

from slm_server.contracts.verdicts import HEALTHY, outcome_of
from slm_server.errors import GatewayError
from slm_server.http1 import HttpError
from slm_server.registry.schema import ModelSpec
from slm_server.router.answer.translated_tap import Tap
from slm_server.router.call.exchange import ANSWERING, Exchange
from slm_server.router.call.fast_path import PieceWriter, SpliceSource
from slm_server.router.call.keepalive import KeepAlive
from slm_server.router.call.waits import running_loop
from slm_server.router.upstream.client import translate
from slm_server.router.watchdog.tripwire import Progress, StallTimer, Tripwire


class Splice:
    """One stream's splice; :meth:`run` relays it to the client's writer until it ends."""

    __slots__ = (
        "_beats",
        "_failure",
        "_mark",
        "_writer",
        "exchange",
        "progress",
        "spec",
        "tap",
        "timer",
        "tripwire",
        "upstream",
    )

    def __init__(
        self,
        spec: ModelSpec,
        exchange: Exchange,
        upstream: SpliceSource,
        tap: Tap,
        timer: StallTimer,
        progress: Progress,
        tripwire: Tripwire,
    ) -> None:
        self.spec = spec
        self.exchange = exchange
        self.upstream = upstream
        self.tap = tap
        self.timer = timer
        self.progress = progress
        self.tripwire = tripwire
        self._writer: PieceWriter | None = None
        self._failure: BaseException | None = None
        self._mark = 0.0
        self._beats: asyncio.TimerHandle | None = None

    async def run(self, writer: PieceWriter, keepalive: KeepAlive | None = None) -> None:
        """Relay until the stream ends; a failure raises the :class:`GatewayError` the
        relay reports in band (the response's head is sent already). Until the answer
        begins, ``keepalive`` beats go to the client between the backend's pieces."""
        upstream, exchange = self.upstream, self.exchange
        self._writer = writer
        self._mark = started = time.perf_counter()
        self.progress.waiting(started)
        if keepalive is not None and exchange.stage != ANSWERING:
            self._beat_after(keepalive)
        try:
            upstream.splice(self._piece)
            while True:
                try:
                    ended = await upstream.settle()
                except HttpError as exc:
                    error = translate(exc, self.spec)
                    if isinstance(error, GatewayError):
                        exchange.note_error(error)
                        self.tripwire.observe(self.spec, outcome_of(error), error.message)
                    raise error from exc
                if self._failure is not None:
                    raise self._failure
                if ended:
                    break
                # The client is full: the router holds the answer up, not the backend.
                self._account()
                self.progress.arrived()
                await writer.drain()
                self._mark = now = time.perf_counter()
                self.progress.waiting(now)
                upstream.resume()
            self._account()
        finally:
            upstream.unsplice()
            self.timer.cancel()
            if self._beats is not None:
                self._beats.cancel()
                self._beats = None
        rest = self.tap.flush()
        if rest:
            writer.write(rest)
        if self.tap.error is not None:
            exchange.error_type = "backend_stream_error"

    def _beat_after(self, keepalive: KeepAlive) -> None:
        """A beat in ``interval`` seconds unless the answer has begun by then. Written
        between two of the backend's pieces, each a whole number of events (the tap
        forwards whole events only)."""

        def due() -> None:
            self._beats = None
            writer = self._writer
            if self.exchange.stage == ANSWERING or writer is None or self._failure is not None:
                return
            writer.write(keepalive.beat())
            self._beat_after(keepalive)

        self._beats = running_loop().call_later(keepalive.interval, due)

    def _account(self) -> None:
        now = time.perf_counter()
        self.exchange.upstream_seconds += now - self._mark
        self._mark = now

    def _piece(self, data: bytes) -> None:
        """One piece of the body, from the upstream connection's parser: never raises."""
        if self._failure is not None or not data:
            return
        exchange = self.exchange
        now = time.perf_counter()
        exchange.upstream_seconds += now - self._mark
        try:
            if exchange.first_chunk is None:
                self.timer.first_byte()
                self.tripwire.observe(self.spec, HEALTHY)
            exchange.note_chunk(now)
            tap = self.tap
            forward = tap.feed(data)
            writer = self._writer
            if forward and writer is not None and writer.write(forward) and writer.full:
                self.upstream.pause()
            if tap.owed is not None:  # an event past the limit: the stream ends now
                self._fail(tap.owed)
        except GatewayError as error:  # what the backend sent broke the stream
            exchange.note_error(error)
            self.tripwire.observe(self.spec, outcome_of(error), error.message)
            self._fail(error)
        except Exception as error:  # a bug of ours: the relay reports it in band
            self._fail(error)
        self._mark = now = time.perf_counter()
        self.progress.came(now)

    def _fail(self, error: BaseException) -> None:
        self._failure = error
        self.upstream.pause()  # wakes run(), which raises it


__all__ = ["Splice"]
