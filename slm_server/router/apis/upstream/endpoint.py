"""``/upstream/<model>/<engine path>``, any method: the request relayed to the model's own
engine as the client wrote it (method, engine path, query, body, the headers worth
passing), and the answer relayed as the engine gave it: its status and body unchanged,
a stream relayed as it comes. Before it is sent it takes what every request takes (API
keys at the door, the body limit, the model's admission gate, its deadline, an
on-demand load); the engine path must be one the engine serves to ``/upstream/`` by
default or one its entry's ``upstream_paths`` lists (:mod:`.paths`), else 403 with why.

The router never reads what it relays, so the watchdog counts only what the engine did
wrong on its own: a refused or broken connection, a stall, a deadline it let pass; the
engine's statuses are health below 500 and nothing at or above it (a malformed body is
the client's, and llama-server answers it 500), see
:func:`~slm_server.contracts.verdicts.classify_engine_status`. A raw request is never
sent twice: it may change the engine's state.
"""

from __future__ import annotations

from starlette.responses import Response
from starlette.types import ASGIApp

from slm_server.errors import GatewayError, HttpStatusError, InvalidRequest
from slm_server.router.answer.answer_fields import answer_fields
from slm_server.router.answer.relay import Relay
from slm_server.router.answer.whole_answer import WholeAnswer
from slm_server.router.apis.upstream.paths import defaults_for, verdict
from slm_server.router.call.admitted_call import Call
from slm_server.router.call.shape import Shape
from slm_server.router.intake.engine_target import EngineTarget
from slm_server.router.intake.reception import Intake
from slm_server.router.upstream.client import content_encoding

# What an answer that says nothing of its type is passed on as.
UNTYPED = "application/octet-stream"


class UpstreamApi:
    """Relays raw requests to the engines the gateway runs."""

    def __init__(self, shape: Shape, relay: Relay) -> None:
        self.shape = shape
        self.relay = relay

    def stream_error(self, intake: Intake, error: GatewayError) -> bytes:
        """OpenAI's in-band error event (a raw stream is never sent keep-alives, so
        nothing of it goes out before the engine's own answer)."""
        return error.sse_event()

    def before_admission(self, intake: Intake) -> Intake:
        """Refuse what must not reach the engine: a remote (the gateway runs no engine
        for it), ``HEAD`` (it has no body to relay) and a path its entry does not
        allow (403, saying why and which registry field allows it)."""
        target = _target(intake)
        spec = intake.spec
        entry = spec.entry
        shown = f"{self.shape.path}{target.model}{target.path}"
        if entry.remote:
            raise InvalidRequest(
                f"The model '{entry.id}' is a remote ({entry.url}): /upstream/ reaches only "
                "the engines this gateway runs; send the remote's own routes there",
                code="upstream_remote",
                param="model",
            )
        if target.method == "HEAD":
            raise HttpStatusError(
                405, f"HEAD {shown}: /upstream/ relays no HEAD; send GET", "method_not_allowed"
            )
        defaults = defaults_for(self.relay.server_kind(spec), entry.backend)
        found = verdict(target.method, target.path, entry.upstream_paths, defaults)
        if not found.allowed:
            raise HttpStatusError(
                403,
                f"{target.method} {shown} is refused: {target.method} {target.path} "
                f"{found.why}. The model's registry entry allows it with upstream_paths "
                f'(e.g. upstream_paths: ["{target.method} {target.path}"])',
                "upstream_path_not_allowed",
            )
        return intake

    async def send(self, call: Call, intake: Intake) -> Response | ASGIApp:
        """The request to the engine, once; a stream relayed as it comes, any other
        answer read whole (within the answer limit) and passed on as it came."""
        target = _target(intake)
        sender = self.relay.sender
        progress = sender.progress(call)
        upstream, timer = await sender.open(call, target.sent, intake.raw, progress, target.method)
        content_type = upstream.headers.get("content-type", "")
        if upstream.status_code == 200 and "event-stream" in content_type:
            call.exchange.stream = True  # relayed as it comes, whatever the body asked
            return await self.relay.replies.reply(call, upstream, timer, progress)
        timer.cancel()
        try:
            try:
                content = await sender.read(call, upstream, progress)
            finally:
                await upstream.aclose()
        finally:
            call.slot.release()
        status = upstream.status_code
        if "json" in content_type and status < 400:
            fields = answer_fields(content)  # for the record: usage, finish reasons
            if fields is not None:
                call.exchange.note_response(fields)
        encoding = content_encoding(upstream)
        headers = {"content-encoding": encoding} if encoding is not None else None
        return WholeAnswer(call.exchange, content, status, content_type or UNTYPED, headers)


def _target(intake: Intake) -> EngineTarget:
    target = intake.target
    assert target is not None, "a raw request is taken in with its target"
    return target


__all__ = ["UpstreamApi"]
