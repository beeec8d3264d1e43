"""The budget for request bodies in flight (``SLM_MAX_BODIES_IN_FLIGHT_MB``): every body
the router holds, from its first byte until its request ends (queued ones included),
counts against one limit, so many large bodies at once cannot exhaust memory. A body
that would pass it is refused with 503 and ``Retry-After`` — on its
``Content-Length`` before any of it is read, else as its bytes arrive. Pure."""

from __future__ import annotations

from slm_server.errors import BodiesOverBudget

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

    def release(self) -> None:
        self._budget.used -= self.size
        self.size = 0
