"""The dashboard: the page at ``GET /ui`` and the three endpoints it reads besides
``/v1/backends/health`` and ``/v1/models/load|unload``.

* ``GET /ui`` (and ``/ui/app.js``, ``/ui/style.css``): static files from the package,
  open without a key — they hold no data; the page asks for a key and sends it.
* ``GET /v1/ui/events``: ``logs/watchdog.jsonl`` as server-sent events, its last
  ``recent`` lines (at most ``MAX_RECENT``) first, then each line as it is appended
  (one ``data:`` JSON object per line; a line that is not JSON comes as
  ``{"unparsed": text}``, a cut one with ``"cut": true``). The file is read in a worker
  thread every ``POLL_SECONDS``, incrementally
  (:class:`~slm_server.router.dashboard.log_tail.Follower`);
  at most ``MAX_STREAMS`` streams at once (429 beyond); a stream ends when its client
  leaves.
* ``GET /v1/ui/requests``: the last finished model requests, newest first.
* ``GET /v1/ui/logs/{role}?lines=N``: the last ``N`` (at most ``MAX_LOG_LINES``) lines
  of that backend's log, the file its launcher published for it, looking back at most
  ``TAIL_BYTES``; only the registry's roles, only files inside the log directory.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from importlib import resources
from pathlib import Path
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from slm_server.errors import InvalidRequest, ModelNotFound, Overloaded
from slm_server.router.call.backend_state import StateSource
from slm_server.router.dashboard.log_tail import Follower, Line, last_lines
from slm_server.router.dispatch.lookup import Registry
from slm_server.router.observe.recent import RecentRequests

POLL_SECONDS: Final = 0.25
HEARTBEAT_SECONDS: Final = 15.0
DEFAULT_RECENT: Final = 200
MAX_RECENT: Final = 1000
MAX_STREAMS: Final = 8
DEFAULT_LOG_LINES: Final = 200
MAX_LOG_LINES: Final = 2000
ASSETS: Final = {
    "index.html": "text/html; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "plot.js": "text/javascript; charset=utf-8",
    "history.js": "text/javascript; charset=utf-8",
    "charts.js": "text/javascript; charset=utf-8",
    "lanes.js": "text/javascript; charset=utf-8",
    "shapes.js": "text/javascript; charset=utf-8",
    "playground.js": "text/javascript; charset=utf-8",
    "request_detail.js": "text/javascript; charset=utf-8",
    "models.js": "text/javascript; charset=utf-8",
}
# The page loads nothing but its own files and talks only to this router.
PAGE_HEADERS: Final = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def _count(request: Request, name: str, default: int, most: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not raw.isdigit() or len(raw) > 9:
        raise InvalidRequest(f"'{name}' must be a whole number from 0 to {most}", param=name)
    return min(int(raw), most)


def event_data(line: Line) -> bytes:
    """One log line as an SSE event: the JSON object itself when it is one."""
    try:
        value: Any = json.loads(line.text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        value = {"unparsed": line.text}
    if line.cut:
        value["cut"] = True
    return b"data: " + json.dumps(value, separators=(",", ":")).encode() + b"\n\n"


class Dashboard:
    """The page and its endpoints; see the module docstring."""

    def __init__(
        self,
        registry: Registry,
        states: StateSource,
        recent: RecentRequests,
        events_path: Path,
        log_dir: Path,
    ) -> None:
        self.registry = registry
        self.states = states
        self.recent = recent
        self.events_path = events_path
        self.log_dir = log_dir
        self.streams = 0
        package = resources.files("slm_server.router.dashboard") / "ui"
        self.assets = {name: (package / name).read_bytes() for name in ASSETS}

    async def page(self, request: Request) -> Response:
        """``GET /ui`` and ``GET /ui/{asset}``."""
        name = request.path_params.get("asset", "index.html")
        body = self.assets.get(name)
        if body is None:
            return Response(b"not found\n", 404, media_type="text/plain")
        return Response(body, media_type=ASSETS[name], headers=PAGE_HEADERS)

    async def requests(self, _request: Request) -> JSONResponse:
        """``GET /v1/ui/requests``."""
        recent = self.recent
        return JSONResponse(
            {"object": "list", "data": recent.newest_first(), "in_flight": recent.under_way()}
        )

    async def logs(self, request: Request) -> JSONResponse:
        """``GET /v1/ui/logs/{role}``."""
        role: str = request.path_params["role"]
        spec = next((s for s in self.registry.enabled if s.role == role), None)
        if spec is None:
            raise ModelNotFound(f"No enabled model has the role '{role[:64]}'", param="role")
        count = _count(request, "lines", DEFAULT_LOG_LINES, MAX_LOG_LINES)
        state = self.states.get(role, spec.entry.port)
        path = self._owned(state.log_path if state is not None else "")
        lines = None if path is None else await asyncio.to_thread(last_lines, path, count)
        return JSONResponse(
            {
                "role": role,
                "model_id": spec.entry.id,
                "log_path": str(path) if path is not None else None,
                "lines": [line.text for line in lines or ()],
                "cut": sum(line.cut for line in lines or ()),
            }
        )

    def _owned(self, published: str) -> Path | None:
        """The published log file when it lies inside the log directory."""
        if not published:
            return None
        path = Path(published)
        try:
            inside = path.resolve().is_relative_to(self.log_dir.resolve())
        except OSError:
            return None
        return path if inside else None

    async def events(self, request: Request) -> Response:
        """``GET /v1/ui/events``."""
        count = _count(request, "recent", DEFAULT_RECENT, MAX_RECENT)
        if self.streams >= MAX_STREAMS:
            raise Overloaded(
                f"At most {MAX_STREAMS} event streams are served at once; close one",
                code="too_many_streams",
                retry_after=5.0,
            )
        return EventStream(self, self._stream(count))

    async def _stream(self, count: int) -> AsyncIterator[bytes]:
        """The stream's body; Starlette cancels it when the client disconnects."""
        follower = Follower(self.events_path)
        first = await asyncio.to_thread(follower.start, count)
        yield b": watchdog events\n\n" + b"".join(event_data(line) for line in first)
        quiet = 0.0
        while True:
            if not follower.behind:
                await asyncio.sleep(POLL_SECONDS)
            # Most looks find nothing new; a stat says so without a worker thread.
            lines = [] if follower.unchanged() else await asyncio.to_thread(follower.poll)
            if lines:
                quiet = 0.0
                yield b"".join(event_data(line) for line in lines)
            elif not follower.behind:
                quiet += POLL_SECONDS
                if quiet >= HEARTBEAT_SECONDS:  # finds a client that left silently
                    quiet = 0.0
                    yield b": keep-alive\n\n"


class EventStream(StreamingResponse):
    """An event stream counted among the dashboard's open ones while it is served."""

    def __init__(self, dashboard: Dashboard, body: AsyncIterator[bytes]) -> None:
        super().__init__(
            body,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self.dashboard = dashboard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.dashboard.streams += 1
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.dashboard.streams -= 1


__all__ = ["Dashboard"]
