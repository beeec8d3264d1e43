"""One proxied request on its way through the router, and its deadline.

A :class:`Call` is made once the request is admitted and carries everything the
endpoint handlers, the sender and the reply need about it: the request, the model it
names, its record (:class:`~slm_server.router.call.exchange.Exchange`), its one
:class:`Deadline`, the headers for the backend and the admission slot it holds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from starlette.requests import Request

from slm_server.registry.schema import ModelSpec
from slm_server.router.call.admission import Slot
from slm_server.router.call.exchange import Exchange
from slm_server.router.call.keepalive import KeepAlive
from slm_server.router.call.waits import ClientWatch, client_of


class Deadline:
    """A request's deadline on one clock, the event loop's (``loop.time()``): set when
    the request arrives, so the time it waits in the queue counts, and read wherever
    the request waits as the loop time it ends at (``at``) or what is left of it."""

    __slots__ = ("_clock", "at", "seconds")

    def __init__(self, seconds: float, clock: Callable[[], float]) -> None:
        self.seconds = seconds
        self._clock = clock
        self.at = clock() + seconds

    def remaining(self) -> float:
        """Seconds left, negative once it has passed."""
        return self.at - self._clock()


@dataclass(eq=False, slots=True)
class Call:
    """One admitted request to one backend.

    ``judged`` says whether a deadline that cuts the request is the backend's to
    answer for (the model's own deadline), or not (the client shortened it with
    ``X-Request-Timeout``). ``hidden_usage`` marks a stream the router asked to carry
    usage for its own record, whose usage-only chunk the client never sees. ``capped``
    says that the preset's cap, not the client's own bound, limits the output: a
    translated answer cut there ends its turn (see :mod:`slm_server.router.answer.translation`).
    ``keepalive``, on a streamed request, says what its client is sent while it
    waits for the answer to begin (None: nothing). ``watch_progress`` marks a stream
    whose engine the router asked for its prompt progress (each report a sign of life,
    silence timed throughout); ``hidden_progress`` that those reports are the
    router's alone, kept from a client that never asked. ``gathered``: a request that
    did not ask to stream, streamed from the engine for the watchdog to judge, its
    whole answer gathered from the stream.
    """

    request: Request
    spec: ModelSpec
    exchange: Exchange
    deadline: Deadline
    judged: bool
    headers: dict[str, str]
    slot: Slot
    hidden_usage: bool = False
    capped: bool = False
    watch_progress: bool = False
    hidden_progress: bool = False
    keepalive: KeepAlive | None = None
    gathered: bool = False

    @property
    def client(self) -> ClientWatch:
        """Who tells the waits that the client has left."""
        return client_of(self.request.scope, self.request.receive)


__all__ = ["Call", "Deadline"]
