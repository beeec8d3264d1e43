"""The budget for request bodies in flight (``SLM_MAX_BODIES_IN_FLIGHT_MB``): every body
the router holds, from its first byte until its request ends (queued ones included),
counts against one limit, so many large bodies at once cannot exhaust memory. A body
that would pass it is refused with 503 and ``Retry-After`` — on its
``Content-Length`` before any of it is read, else as its bytes arrive. A JSON body is
then charged what it costs parsed (:mod:`.parsed_cost`) before it is parsed: one whose
cost alone passes the whole budget is refused with 413, as too large for this router.
Pure."""

from __future__ import annotations

from slm_server.errors import BodiesOverBudget, PayloadTooLarge

RETRY_AFTER_SECONDS = 1.0


class BodyBudget:
    def __init__(self, limit_bytes: int) -> None:
        self.limit = limit_bytes
        self.used = 0

    def hold(self) -> Held:
        """A holding for one request's body, empty until :meth:`Held.take`."""
        return Held(self)


class Held:
    """What one request holds of the budget; :meth:`release` gives it all back."""

    __slots__ = ("_budget", "size")

    def __init__(self, budget: BodyBudget) -> None:
        self._budget = budget
        self.size = 0

    def take(self, size: int) -> None:
        """Hold ``size`` more bytes, or raise :class:`BodiesOverBudget`."""
        budget = self._budget
        if budget.used + size > budget.limit:
            raise BodiesOverBudget(
                f"The router holds {budget.used} bytes of request bodies and takes at most "
                f"{budget.limit} (SLM_MAX_BODIES_IN_FLIGHT_MB); retry shortly",
                retry_after=RETRY_AFTER_SECONDS,
            )
        budget.used += size
        self.size += size

    def take_parsed(self, cost: int) -> None:
        """Hold ``cost`` more bytes for the body parsed: 413 when the body and its cost
        together pass the whole budget (it could never be parsed here), else as
        :meth:`take`."""
        limit = self._budget.limit
        if self.size + cost > limit:
            raise PayloadTooLarge(
                f"The request body would take {(self.size + cost) // 2**20} MiB of the "
                f"router's memory once parsed, more than its budget of {limit // 2**20} MiB "
                "for bodies in flight (SLM_MAX_BODIES_IN_FLIGHT_MB); send fewer values",
                code="request_too_large",
            )
        self.take(cost)

    def release(self) -> None:
        self._budget.used -= self.size
        self.size = 0
