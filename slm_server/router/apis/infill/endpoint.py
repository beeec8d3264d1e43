"""``POST /infill`` and ``POST /v1/completions`` with OpenAI's ``suffix``: filling in the
middle, for a model whose vocabulary has the tokens (:mod:`slm_server.memory.fill_in`;
else 400 naming why, before the request waits for a slot or a load once its file has
been read).

``/infill`` is llama-server's own, sent as it came (routed by ``model``, or to the
registry's ``infill_default`` when it names none, as llama.vscode does) and answered as
llama-server answers. llama-server's ``/v1/completions`` ignores ``suffix`` at the pinned
commit (``oaicompat_completion_params_parse``, which refused it, is no longer called): it
would continue the prompt as if there were none. So a completions request with one is
translated to ``/infill`` (:mod:`.to_infill`) and the answer back to OpenAI's shape, whole
(:mod:`.from_infill`) or streamed (:mod:`.events`); llama-cpp-python's server fills in
the middle on its own ``suffix`` and is sent the request as it is.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from starlette.responses import Response
from starlette.types import ASGIApp

from slm_server.contracts import engine_paths
from slm_server.errors import GatewayError, InvalidRequest
from slm_server.memory.fill_in import Infill
from slm_server.registry.schema import ModelSpec
from slm_server.router.answer.relay import Relay
from slm_server.router.apis.infill.events import DONE, InfillStreamTranslator, event
from slm_server.router.apis.infill.from_infill import Head, infill_to_completion
from slm_server.router.apis.infill.to_infill import check_suffix, to_infill
from slm_server.router.apis.passthrough.endpoint import PassThrough
from slm_server.router.call.admitted_call import Call
from slm_server.router.call.exchange import Exchange
from slm_server.router.call.shape import Shape
from slm_server.router.intake.reception import Intake
from slm_server.router.intake.strict_json import dumps_body
from slm_server.router.upstream.client import backend_error_body
from slm_server.router.upstream.sse import is_report

# The engine that fills in the middle on completions' own ``suffix``, and has no /infill.
FILLS_IN_ITSELF = "llama_cpp.server"


def _refusal(spec: ModelSpec, found: Infill) -> InvalidRequest:
    return InvalidRequest(
        f"The model '{spec.entry.id}' cannot fill in the middle: {found.why}. /infill and "
        "completions' 'suffix' need a model whose vocabulary has the fill-in-the-middle "
        "tokens (GET /v1/models says which: 'infill')",
        code="infill_not_supported",
        param="model",
    )


def refuse_known(relay: Relay, spec: ModelSpec) -> None:
    """Before admission: refuse a model known not to fill in the middle; begin reading
    the file of one not known yet (:meth:`send` then waits for it)."""
    found = relay.infill.known(spec.entry)
    if found is None:
        relay.infill.start(spec.entry)
    elif found.takes is not True:
        raise _refusal(spec, found)


async def refuse(relay: Relay, spec: ModelSpec) -> None:
    """Refuse a model that does not fill in the middle, its file read if need be."""
    found = await relay.infill.of(spec.entry)
    if found.takes is not True:
        raise _refusal(spec, found)


class InfillApi:
    """``POST /infill``, sent as it came."""

    def __init__(self, shape: Shape, relay: Relay) -> None:
        self.shape = shape
        self.relay = relay

    def stream_error(self, intake: Intake, error: GatewayError) -> bytes:
        """An in-band error event, as llama-server's own stream ends in one."""
        return error.sse_event()

    def before_admission(self, intake: Intake) -> Intake:
        refuse_known(self.relay, intake.spec)
        return intake

    async def send(self, call: Call, intake: Intake) -> Response | ASGIApp:
        await refuse(self.relay, call.spec)
        kind = self.relay.server_kind(call.spec)
        if kind == FILLS_IN_ITSELF:
            raise InvalidRequest(
                f"The model '{call.spec.entry.id}' runs on {kind}, which has no /infill; "
                "send POST /v1/completions with 'suffix' instead",
                code="infill_not_supported",
                param="model",
            )
        return await self.relay.relay(call, self.shape.path, await intake.body())


class SuffixTranslation:
    """A completions request's answer from llama-server's infill answer."""

    api = "completions with 'suffix'"
    media_type = "text/event-stream"

    def __init__(self, head: Head, *, include_usage: bool) -> None:
        self.head = head
        self.translator = InfillStreamTranslator(head, include_usage=include_usage)

    async def whole(self, native: dict[str, Any]) -> dict[str, Any]:
        return infill_to_completion(native, self.head)

    def error_body(self, status: int, content: bytes) -> bytes:
        return backend_error_body(status, content)

    def tap(self, exchange: Exchange, max_event_bytes: int) -> None:
        """Walked piece by piece (:meth:`stream`), never translated as it is spliced."""

    async def stream(
        self, chunks: AsyncIterator[dict[str, Any]], exchange: Exchange
    ) -> AsyncIterator[bytes]:
        """The parsed infill events as completion chunks; a backend's in-band error
        ends them. The engine's prompt progress reports are the router's."""
        translator = self.translator
        async for native in chunks:
            if is_report(exchange, native):
                continue
            error = native.get("error")
            if error is not None:
                exchange.error_type = "backend_stream_error"
                yield event({"error": error if isinstance(error, dict) else {"message": error}})
                return
            for chunk in translator.feed(native):
                exchange.note_response(chunk)
                yield event(chunk)
        for chunk in translator.finish():
            yield event(chunk)
        if translator.usage is not None:
            exchange.note_response({"usage": translator.usage})
        yield DONE

    def stream_error(self, error: GatewayError) -> bytes:
        return error.sse_event()


class SuffixCompletions(PassThrough):
    """``POST /v1/completions``: passed through as it is, or, with ``suffix``, sent to
    ``/infill`` and answered in completions' shape."""

    def before_admission(self, intake: Intake) -> Intake:
        if intake.payload.get("suffix") is None:
            return intake
        check_suffix(intake.payload)
        refuse_known(self.relay, intake.spec)
        return intake

    async def send(self, call: Call, intake: Intake) -> Response | ASGIApp:
        payload = intake.payload
        if payload.get("suffix") is None:
            return await super().send(call, intake)
        await refuse(self.relay, call.spec)
        if self.relay.server_kind(call.spec) == FILLS_IN_ITSELF:
            return await super().send(call, intake)
        options = payload.get("stream_options")
        asked = isinstance(options, dict) and options.get("include_usage") is True
        model = payload.get("model")
        head = Head(model if isinstance(model, str) else call.spec.entry.id)
        translation = SuffixTranslation(head, include_usage=asked and not call.hidden_usage)
        body = dumps_body(to_infill(payload))
        return await self.relay.relay(call, engine_paths.INFILL, body, translation)


__all__ = ["InfillApi", "SuffixCompletions", "SuffixTranslation", "refuse", "refuse_known"]
