"""``POST /v1/models/pull``, ``GET /v1/models/local`` and ``POST /v1/models/add``: the
command line's ``pull``, ``models --json`` and ``add`` (then its reload) from the API.

Off unless ``SLM_PULL_API=true`` (403 ``pull_disabled``): they write to the disk and to
the registry. A pull is answered as an event stream: each event of the pull
(:func:`~slm_server.pull.events.as_json`: ``planned``, ``progress``, ``file``), then
``done`` or ``error``. It runs in a worker thread (:mod:`.pulls`) whose events cross to
the event loop through a bounded hand-off (:mod:`.handoff`); a client that leaves
cancels it at its next chunk, what arrived staying for a later pull to resume.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from slm_server.add.command import Added, Refused, add_entry
from slm_server.add.command import Request as AddRequest
from slm_server.add.reload import Reloaded, reload_gateway
from slm_server.add.source import Source
from slm_server.discover import listing
from slm_server.discover.places import places
from slm_server.errors import GatewayError, InvalidRequest
from slm_server.pull.errors import PullError
from slm_server.pull.events import as_json
from slm_server.pull.result import Pulled
from slm_server.registry.schema import ConfigError, inspect_registry, read_registry_text
from slm_server.router.apis.models_admin.bodies import PullBody, add_body, pull_body, source_of
from slm_server.router.apis.models_admin.pulls import PullJob, Pulls
from slm_server.router.call.drain import Drain
from slm_server.router.call.waits import ClientWatch, client_of, running_loop
from slm_server.router.intake.small_body import read_small_json
from slm_server.router.ondemand.loader import Commander
from slm_server.router.reload.follower import Follower
from slm_server.router.reload.reload_api import CATCH_UP_SECONDS
from slm_server.settings import Settings

MAX_BODY_BYTES = 64 * 1024
# How often a quiet stream looks at the drain, and sends a comment after how long.
TICK_SECONDS = 1.0
HEARTBEAT_SECONDS = 15.0


class PullDisabled(GatewayError):
    """The models' endpoints are off (``SLM_PULL_API``)."""

    status = 403
    error_type = "invalid_request_error"
    default_code = "pull_disabled"


class AddRefused(GatewayError):
    """An add refused, with the status its reason takes and every problem ``check``
    found listed in ``problems``."""

    error_type = "invalid_request_error"

    def __init__(self, status: int, message: str, code: str, problems: tuple[str, ...]) -> None:
        super().__init__(message, code=code, param="model" if status in (400, 404) else None)
        self.status = status
        self.problems = problems

    def body(self) -> dict[str, Any]:
        body = super().body()
        body["error"]["problems"] = list(self.problems)
        return body


# Each refusal's status and code.
REFUSALS: dict[str, tuple[int, str]] = {
    "not_found": (404, "model_not_found"),
    "not_gguf": (400, "not_gguf"),
    "taken": (409, "id_taken"),
    "no_port": (409, "no_port"),
    "unappendable": (409, "registry_unappendable"),
    "not_checked": (409, "entry_invalid"),
    "not_written": (500, "registry_not_written"),
    "unreadable": (409, "registry_invalid"),
}


def refused_error(refused: Refused) -> AddRefused:
    status, code = REFUSALS[refused.reason]
    message = refused.message
    if refused.reason == "taken":
        message += '; choose another with "id"'
    return AddRefused(status, message, code, refused.problems)


def added_json(added: Added, reloaded: Reloaded) -> dict[str, Any]:
    """What an add did: the entry written, what the command line prints of it, the
    reload's outcome."""
    return {
        "role": added.role,
        "id": added.model_id,
        "entry": added.fields,
        "registry": str(added.registry),
        "lines": added.lines(),
        "reload": reloaded.as_json(),
    }


def done_json(pulled: Pulled, added: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "type": "done",
        "reference": pulled.reference,
        "model": str(pulled.model),
        "projector": str(pulled.projector) if pulled.projector is not None else None,
        "parts": [str(part) for part in pulled.parts],
        "extras": [str(extra) for extra in pulled.extras],
        "fetched_bytes": pulled.fetched_bytes,
        "added": added,
    }


def event_bytes(body: Mapping[str, Any]) -> bytes:
    return b"data: " + json.dumps(body, ensure_ascii=False).encode() + b"\n\n"


class PullStream(StreamingResponse):
    """A pull's event stream; the pull is abandoned when the answer ends, however it
    ends (even unsent: the model is then free to pull again)."""

    def __init__(self, job: PullJob, body: AsyncIterator[bytes]) -> None:
        super().__init__(
            body,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self.job = job

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.abandon()


class ModelsAdmin:
    """The three endpoints of one router, and its running pulls."""

    def __init__(
        self,
        settings: Settings,
        commander: Commander,
        follower: Follower,
        drain: Drain,
        env: Mapping[str, str] | None = None,
        pulls: Pulls | None = None,
    ) -> None:
        self.settings = settings
        self.commander = commander
        self.follower = follower
        self.drain = drain
        self.env = os.environ if env is None else env
        self.pulls = pulls or Pulls(settings.pull)
        self._adding = asyncio.Lock()  # one add at a time: each appends to the registry
        self._adds: set[asyncio.Task[dict[str, Any] | Refused]] = set()

    # Life.

    def start(self) -> None:
        """At startup: running pulls end when the drain period does."""
        self.drain.subscribe(self.pulls.cancel_all)

    async def close(self) -> None:
        """At shutdown: every pull cancelled, its thread joined, every add finished."""
        self.drain.unsubscribe(self.pulls.cancel_all)
        await self.pulls.close()
        if self._adds:  # an add whose client left: its reload answers within its timeout
            await asyncio.wait(list(self._adds))

    # The requests.

    def _enabled(self) -> None:
        if not self.settings.pull.api_enabled:
            raise PullDisabled(
                "Pulling and adding models through the API is off: set SLM_PULL_API=true "
                "in the router's environment (or .env) and restart it to turn it on "
                "(python -m slm_server pull and add work without it)"
            )

    async def _payload(self, request: Request) -> dict[str, Any]:
        too_large = f"A pull or add body is at most {MAX_BODY_BYTES} bytes"
        return await read_small_json(request, MAX_BODY_BYTES, too_large)

    async def local(self, _request: Request) -> Response:
        """``GET /v1/models/local``: what ``python -m slm_server models --json`` lists."""
        self._enabled()
        text = await asyncio.to_thread(self._listing)
        return Response(text, media_type="application/json")

    def _listing(self) -> str:
        path = self.settings.config_path
        try:
            registry = inspect_registry(read_registry_text(path), path)
        except ConfigError:
            registry = None  # SERVED AS left empty, as the command line does
        looked_in = places(self.env, self.settings.pull.models_dir)
        return listing.render_json(listing.discover(looked_in, listing.served_files(registry)))

    async def add(self, request: Request) -> JSONResponse:
        """``POST /v1/models/add``: the entry written and the gateway reloaded."""
        self._enabled()
        body = add_body(await self._payload(request))
        models_dir = self.settings.pull.models_dir
        source = await asyncio.to_thread(source_of, body.model, self.env, models_dir)
        added = await self._add(AddRequest(body.model, body.model_id, body.load), source)
        if isinstance(added, Refused):
            raise refused_error(added)
        return JSONResponse({"object": "model.added", **added})

    async def _add(self, request: AddRequest, source: Source | None) -> dict[str, Any] | Refused:
        """Add, then reload the gateway and route by what it applied: carried through
        even when the client leaves half-way (a registry written is then reloaded)."""
        task = asyncio.ensure_future(self._add_and_reload(request, source))
        self._adds.add(task)
        task.add_done_callback(self._adds.discard)
        return await asyncio.shield(task)

    async def _add_and_reload(
        self, request: AddRequest, source: Source | None
    ) -> dict[str, Any] | Refused:
        async with self._adding:
            try:
                result = await asyncio.to_thread(
                    add_entry, self.settings, request, self.env, source
                )
            except ConfigError as exc:
                path = self.settings.config_path
                problems = tuple(str(p) for p in exc.problems)
                return Refused("unreadable", f"{path} cannot be read: fix it first", problems)
            if isinstance(result, Refused):
                return result
            reloaded = await reload_gateway(self.commander)
            reply = reloaded.reply
            if reply is not None and reply.ok and reply.version is not None:
                await self.follower.catch_up(reply.version, CATCH_UP_SECONDS)
        return added_json(result, reloaded)

    async def pull(self, request: Request) -> Response:
        """``POST /v1/models/pull``: 400 before the stream for a body or reference that
        will not do, 409 while the same model is being pulled, 429 past the limit."""
        self._enabled()
        body = pull_body(await self._payload(request))
        try:
            job = self.pulls.reserve(body.model, running_loop())
        except PullError as exc:  # parsed already; kept for the type's sake
            raise InvalidRequest(str(exc), code=exc.kind, param="model") from None
        client = client_of(request.scope, request.receive)
        return PullStream(job, self._stream(job, body, client))

    async def _stream(
        self, job: PullJob, body: PullBody, client: ClientWatch
    ) -> AsyncIterator[bytes]:
        if not client.arm(job.abandon):
            job.abandon()
            return
        try:
            job.start()
            final: Pulled | PullError | None = None
            quiet = 0.0
            while final is None:
                if self.drain.draining:
                    job.cancel.set()  # ends at its next chunk, with an error event
                batch = await job.handoff.take(TICK_SECONDS)
                if job.handoff.closed:
                    return  # the client left, or the drain period is over
                if not batch:
                    quiet += TICK_SECONDS
                    if quiet >= HEARTBEAT_SECONDS:  # finds a client that left silently
                        quiet = 0.0
                        yield b": keep-alive\n\n"
                    continue
                quiet = 0.0
                events = []
                for item in batch:
                    if isinstance(item, Pulled | PullError):
                        final = item
                    else:
                        events.append(event_bytes(as_json(item)))
                if events:
                    yield b"".join(events)
            if isinstance(final, PullError):
                yield event_bytes({"type": "error", "code": final.kind, "message": str(final)})
                return
            added = None
            if body.add:
                request = AddRequest(str(final.model), body.model_id, body.load)
                outcome = await self._add(request, None)
                if isinstance(outcome, Refused):
                    error = refused_error(outcome)
                    yield event_bytes(
                        {
                            "type": "error",
                            "code": error.code,
                            "message": f"pulled to {final.model}, but not added: {error.message}",
                            "problems": list(error.problems),
                            "model": str(final.model),
                        }
                    )
                    return
                added = outcome
            yield event_bytes(done_json(final, added))
        finally:
            client.disarm()
            job.abandon()


__all__ = ["AddRefused", "ModelsAdmin", "PullDisabled", "added_json", "done_json"]
