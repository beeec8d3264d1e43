"""``GET /v1/ui/history[?since=<wall seconds>]``: the dashboard's history
(:mod:`~slm_server.router.dashboard.history`) as JSON, only the samples and events
newer than ``since`` when it is given, so that the page asks for what it lacks; at most
the newest ``MAX_ANSWER_SAMPLES`` samples in one answer (``truncated`` says when older
ones were left out), so that an hour at a short interval does not hold the event
loop."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import JSONResponse

from slm_server.errors import InvalidRequest
from slm_server.router.dashboard.history import History
from slm_server.settings import HistorySettings


def since_of(request: Request) -> float | None:
    """The ``since`` query parameter: a finite number of wall seconds, or absent."""
    raw = request.query_params.get("since")
    if raw is None:
        return None
    try:
        since = float(raw)
    except ValueError:
        since = math.nan
    if not math.isfinite(since):
        raise InvalidRequest(
            "'since' must be a number: wall-clock seconds, as the answer's 'times' give",
            param="since",
        )
    return since


class HistoryApi:
    """Answers the history ``history`` keeps, as ``settings`` has it sampled."""

    def __init__(
        self, history: History, settings: HistorySettings, wall: Callable[[], float] = time.time
    ) -> None:
        self.history = history
        self.settings = settings
        self.wall = wall

    async def answer(self, request: Request) -> JSONResponse:
        """``GET /v1/ui/history``."""
        since = since_of(request)
        return JSONResponse(
            {
                "object": "ui.history",
                "interval_seconds": self.settings.interval_seconds,
                "keep_seconds": self.settings.keep_seconds,
                "now": round(self.wall(), 3),
                **self.history.answer(since),
            }
        )


__all__ = ["HistoryApi", "since_of"]
