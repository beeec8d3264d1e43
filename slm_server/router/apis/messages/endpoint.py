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
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp

from slm_server.errors import BackendProtocolError, GatewayError, anthropic_error_body
from slm_server.registry.schema import ModelSpec
from slm_server.router.answer.reply import Replies
from slm_server.router.answer.translation import ChatTranslation, error_message
from slm_server.router.apis.messages.answer import backend_error, chat_to_message
from slm_server.router.apis.messages.count import estimate_tokens
from slm_server.router.apis.messages.request import messages_to_chat
from slm_server.router.apis.messages.stream import MessageStreamTranslator
from slm_server.router.call.admitted_call import Call
from slm_server.router.call.exchange import Exchange
from slm_server.router.intake.payload import apply_defaults
from slm_server.router.intake.strict_json import dumps_body
from slm_server.router.intake.tool_calls import check_tool_calls
from slm_server.router.upstream.sender import Sender

MESSAGES = "/v1/messages"
COUNT_TOKENS = "/v1/messages/count_tokens"
CHAT = "/v1/chat/completions"
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


class TokenCount:
    """A backend's own ``count_tokens`` answer, checked; its errors in Anthropic's shape."""

    api = "the Messages API"

    def whole(self, answer: dict[str, Any]) -> dict[str, Any]:
        tokens = answer.get("input_tokens")
        if isinstance(tokens, bool) or not isinstance(tokens, int):
            raise BackendProtocolError("the backend's token count has no integer input_tokens")
        return {"input_tokens": tokens}

    def error_body(self, status: int, content: bytes) -> bytes:
        return _dumps(backend_error(status, content))

    def stream_error(self, error: GatewayError) -> bytes:  # never a stream
        return error.anthropic_sse_event()

    async def stream(
        self, chunks: AsyncIterator[dict[str, Any]], exchange: Exchange
    ) -> AsyncIterator[bytes]:  # never a stream
        async for _chunk in chunks:
            pass
        yield b""


class MessagesApi:
    """The Messages API over any chat-completions backend."""

    def __init__(
        self,
        sender: Sender,
        replies: Replies,
        sampling_defaults: Callable[[ModelSpec], dict[str, Any]],
        server_kind: Callable[[ModelSpec], str | None],
    ) -> None:
        self.sender = sender
        self.replies = replies
        self.sampling_defaults = sampling_defaults
        self.server_kind = server_kind

    @staticmethod
    def prepare(payload: dict[str, Any], spec: ModelSpec, counting: bool) -> dict[str, Any]:
        """The chat completions request for ``payload`` (to ``count_tokens`` when
        ``counting``), checked before it is admitted (400 naming the field for what
        cannot be served)."""
        takes_images = spec.entry.model_type == "multimodal"
        chat = messages_to_chat(payload, takes_images=takes_images, counting=counting)
        check_tool_calls(chat)  # the translation's own checks name the Messages fields
        return chat

    def counts_natively(self, spec: ModelSpec) -> bool:
        """Whether ``spec``'s backend is asked to count tokens: llama-server (and a
        remote, which may be one: its 404 makes it an estimate); else the router
        estimates without asking, and without waiting for a slot."""
        entry = spec.entry
        if entry.remote:
            return True
        if entry.backend != "llamacpp":
            return False
        kind = self.server_kind(spec)
        return kind is None or kind in NATIVE_COUNT_KINDS

    @staticmethod
    def estimate(chat: dict[str, Any]) -> Response:
        """The answer to ``count_tokens`` from the router's estimate."""
        return JSONResponse({"input_tokens": estimate_tokens(chat)})

    async def create(
        self, call: Call, chat: dict[str, Any], request: dict[str, Any]
    ) -> Response | ASGIApp:
        """``chat`` (the translated request) to the backend's chat completions; the answer
        translated back. ``request`` is the Messages request as the backend is sent it."""
        spec = call.spec
        chat = {**chat, "model": request.get("model")}
        apply_defaults(chat, CHAT, self.sampling_defaults(spec))
        progress = self.sender.progress(call)
        upstream, timer = await self.sender.open(call, CHAT, dumps_body(chat), progress)
        translation = MessagesTranslation(request, capped=call.capped)
        return await self.replies.reply(call, upstream, timer, progress, translation=translation)

    async def count_tokens(
        self, call: Call, chat: dict[str, Any], raw: bytes
    ) -> Response | ASGIApp:
        """The backend's own count of request ``raw``; the estimate when it has no route."""
        progress = self.sender.progress(call)
        upstream, timer = await self.sender.open(call, COUNT_TOKENS, raw, progress)
        if upstream.status_code not in COUNT_FALLBACK_STATUSES:
            return await self.replies.reply(
                call, upstream, timer, progress, translation=TokenCount()
            )
        timer.cancel()
        try:
            await upstream.aclose()
        finally:
            call.slot.release()
        return self.estimate(chat)


__all__ = ["COUNT_TOKENS", "MESSAGES", "MessagesApi", "MessagesTranslation"]
