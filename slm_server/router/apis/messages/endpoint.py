"""``POST /v1/messages`` and ``POST /v1/messages/count_tokens``: the Messages request
translated to chat completions and sent to the backend's ``/v1/chat/completions``, the
answer (whole, or event by event) translated back; token counts asked of llama-server's
own ``/v1/messages/count_tokens``, else estimated (:mod:`.count`).

Every backend is translated for, llama-server too: its own ``/v1/messages`` (at the
pinned release) validates nothing (an unknown role, an empty ``messages``, an unknown
block type are all served), answers an image to a text-only model with a 500 that the
watchdog would count against it, gives errors in OpenAI's shape, and ends a stop
sequence with ``stop_reason: end_turn``; the router's translation is one path for every
backend, and the model reads the same prompt, since llama-server's route converts to
its chat completions too.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp

from slm_server.errors import BackendProtocolError, GatewayError, anthropic_error_body
from slm_server.registry.schema import ModelSpec
from slm_server.router.answer.relay import Relay
from slm_server.router.answer.translation import ChatTranslation, WholeOnly, error_message
from slm_server.router.apis.messages.count import estimate_tokens
from slm_server.router.apis.messages.events import MessageStreamTranslator
from slm_server.router.apis.messages.from_chat import backend_error, chat_to_message
from slm_server.router.apis.messages.to_chat import messages_to_chat
from slm_server.router.call.admitted_call import Call
from slm_server.router.call.shape import Shape
from slm_server.router.intake.payload import apply_defaults, gather_stream
from slm_server.router.intake.reception import Intake
from slm_server.router.intake.strict_json import dumps_body
from slm_server.router.intake.tool_calls import check_tool_calls

# A backend answering these to count_tokens has no such route: the router estimates.
COUNT_FALLBACK_STATUSES = frozenset({404, 405, 501})
# The servers that count natively: llama-server (local, or a remote that may be one).
NATIVE_COUNT_KINDS = frozenset({"llama-server"})


def _dumps(body: dict[str, Any]) -> bytes:
    return json.dumps(body, ensure_ascii=False).encode()


class MessagesTranslation(ChatTranslation[MessageStreamTranslator]):
    """The Messages API's answer to ``request``, from chat completions; ``capped``: the
    preset's cap, not the client's ``max_tokens``, limits the output (a cut there is
    ``end_turn``, see :func:`~slm_server.router.answer.translation.cap_ends_turn`)."""

    api = "the Messages API"

    def __init__(self, request: dict[str, Any], *, capped: bool = False) -> None:
        super().__init__(request, MessageStreamTranslator(request), capped=capped)

    def answer(self, chat: dict[str, Any]) -> dict[str, Any]:
        return chat_to_message(chat, self.request)

    def failed(self, error: Any) -> list[bytes]:
        return self.translator.error(anthropic_error_body(500, error_message(error)))

    def error_body(self, status: int, content: bytes) -> bytes:
        return _dumps(backend_error(status, content))

    def stream_error(self, error: GatewayError) -> bytes:
        return b"".join(self.translator.error(error.anthropic_body()))


class TokenCount(WholeOnly):
    """A backend's own ``count_tokens`` answer, checked; its errors in Anthropic's shape."""

    api = "the Messages API"

    async def whole(self, answer: dict[str, Any]) -> dict[str, Any]:
        tokens = answer.get("input_tokens")
        if isinstance(tokens, bool) or not isinstance(tokens, int):
            raise BackendProtocolError("the backend's token count has no integer input_tokens")
        return {"input_tokens": tokens}

    def error_body(self, status: int, content: bytes) -> bytes:
        return _dumps(backend_error(status, content))

    def stream_error(self, error: GatewayError) -> bytes:  # never a stream
        return error.anthropic_sse_event()


def _translated_to(shape: Shape) -> Shape:
    """The shape ``shape``'s requests are sent to a backend as (chat completions)."""
    if shape.translated_to is None:
        raise ValueError(f"the {shape.name} shape names no shape it is translated to")
    return shape.translated_to


def translated(intake: Intake) -> dict[str, Any]:
    """The chat completions request :func:`prepare` made of ``intake``."""
    if intake.translated is None:
        raise ValueError("a Messages request is sent only once prepared")
    return intake.translated


def prepare(intake: Intake, counting: bool) -> Intake:
    """``intake`` with its chat completions request (to ``count_tokens`` when
    ``counting``), checked before it is admitted (400 naming the field for what cannot
    be served)."""
    takes_images = intake.spec.entry.model_type == "multimodal"
    chat = messages_to_chat(intake.payload, takes_images=takes_images, counting=counting)
    check_tool_calls(chat)  # the translation's own checks name the Messages fields
    return replace(intake, translated=chat)


class MessagesApi:
    """``POST /v1/messages`` over any chat-completions backend."""

    def __init__(self, shape: Shape, relay: Relay) -> None:
        self.chat = _translated_to(shape)
        self.relay = relay

    def stream_error(self, intake: Intake, error: GatewayError) -> bytes:
        """The Messages stream's ``error`` event."""
        return error.anthropic_sse_event()

    def before_admission(self, intake: Intake) -> Intake:
        """The request translated to chat completions (refused before it waits for a
        slot)."""
        return prepare(intake, counting=False)

    async def send(self, call: Call, intake: Intake) -> Response | ASGIApp:
        """The translated request to the backend's chat completions; the answer
        translated back. The Messages request is as the backend is sent it (its
        ``model`` the backend's name for it)."""
        request = intake.payload
        chat = {**translated(intake), "model": request.get("model")}
        if call.watch_progress:  # the reports are the router's: the translation drops them
            chat["return_progress"] = True
        elif gather_stream(chat, self.chat, intake.reports):
            call.gathered = call.watch_progress = True
        apply_defaults(chat, self.chat, self.relay.sampling_defaults(call.spec))
        translation = MessagesTranslation(request, capped=call.capped)
        chat = (
            await self.relay.guarded(call, chat, intake.alias, intake.reports, translation) or chat
        )
        return await self.relay.relay(call, self.chat.path, dumps_body(chat), translation)


class CountTokensApi:
    """``POST /v1/messages/count_tokens``: llama-server's own count, else the router's
    estimate."""

    def __init__(self, shape: Shape, relay: Relay) -> None:
        self.shape = shape
        self.relay = relay

    def stream_error(self, intake: Intake, error: GatewayError) -> bytes:  # never a stream
        return error.anthropic_sse_event()

    def before_admission(self, intake: Intake) -> Intake | Response:
        """The request checked as a Messages request; the router's estimate at once,
        without waiting for a slot, for a backend that is not asked (see
        :meth:`counts_natively`)."""
        intake = prepare(intake, counting=True)
        if not self.counts_natively(intake.spec):
            return self.estimate(translated(intake))
        return intake

    def counts_natively(self, spec: ModelSpec) -> bool:
        """Whether ``spec``'s backend is asked to count tokens: llama-server (and a
        remote, which may be one: its 404 makes it an estimate); else the router
        estimates without asking, and without waiting for a slot."""
        entry = spec.entry
        if entry.remote:
            return True
        if entry.backend != "llamacpp":
            return False
        kind = self.relay.server_kind(spec)
        return kind is None or kind in NATIVE_COUNT_KINDS

    @staticmethod
    def estimate(chat: dict[str, Any]) -> Response:
        """The answer to ``count_tokens`` from the router's estimate."""
        return JSONResponse({"input_tokens": estimate_tokens(chat)})

    async def send(self, call: Call, intake: Intake) -> Response | ASGIApp:
        """The backend's own count of the request; the estimate when it has no route."""
        sender = self.relay.sender
        progress = sender.progress(call)
        upstream, timer = await sender.open(call, self.shape.path, await intake.body(), progress)
        if upstream.status_code not in COUNT_FALLBACK_STATUSES:
            return await self.relay.replies.reply(
                call, upstream, timer, progress, translation=TokenCount()
            )
        timer.cancel()
        try:
            await upstream.aclose()
        finally:
            call.slot.release()
        return self.estimate(translated(intake))


__all__ = ["CountTokensApi", "MessagesApi", "MessagesTranslation"]
