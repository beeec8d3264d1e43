"""``POST /v1/responses``: the backend's own Responses API where it is OpenAI-shaped,
else the request converted to chat completions and the answer (whole, or event by
event) converted back by the router's translator. A request that uses what only the
translator serves (namespaces, custom tools, hosted tools to leave out) is translated
whatever the backend; the hosted tools left out are noted on the exchange, which names
them in the answer's ``x-slm-dropped-tools`` header and the access line."""

from __future__ import annotations

from typing import Any

from starlette.responses import Response
from starlette.types import ASGIApp

from slm_server.errors import GatewayError
from slm_server.router.answer.relay import Relay
from slm_server.router.answer.translation import ChatTranslation
from slm_server.router.apis.responses.events import ResponseStreamTranslator
from slm_server.router.apis.responses.from_chat import chat_to_response
from slm_server.router.apis.responses.to_chat import needs_translation, translate_request
from slm_server.router.call.admitted_call import Call
from slm_server.router.call.shape import Shape
from slm_server.router.intake.payload import apply_defaults, gather_stream
from slm_server.router.intake.reception import Intake
from slm_server.router.intake.strict_json import dumps_body
from slm_server.router.intake.tool_calls import check_tool_calls
from slm_server.router.upstream.client import backend_error_body

# A backend answering these to /v1/responses has none: the router translates.
RESPONSES_FALLBACK_STATUSES = frozenset({404, 422})
# Backends whose own /v1/responses is asked first. llama-server's (at the pinned
# release, and llama-cpp-python has none) is not OpenAI-shaped: its events lack
# sequence_number and most output/content indexes, response.created lacks created_at,
# model and tools, a cut answer says completed; the openai SDK's responses.stream()
# fails on it. For llama.cpp backends the router translates to chat completions itself.
OWN_RESPONSES_BACKENDS = frozenset({"mlx"})


class ResponsesTranslation(ChatTranslation[ResponseStreamTranslator]):
    """The Responses API's answer to ``request``, from chat completions."""

    api = "the Responses API"

    def __init__(self, request: dict[str, Any], *, capped: bool = False) -> None:
        super().__init__(request, ResponseStreamTranslator(request), capped=capped)

    def answer(self, chat: dict[str, Any]) -> dict[str, Any]:
        return chat_to_response(chat, self.request)

    def failed(self, error: Any) -> list[bytes]:
        message = error.get("message") if isinstance(error, dict) else str(error)
        return self.translator.error(str(message))

    def error_body(self, status: int, content: bytes) -> bytes:
        return backend_error_body(status, content)

    def stream_error(self, error: GatewayError) -> bytes:
        return b"".join(self.translator.error(error.message))


class ResponsesApi:
    """``POST /v1/responses`` over any backend."""

    def __init__(self, shape: Shape, relay: Relay) -> None:
        if shape.translated_to is None:
            raise ValueError("the Responses shape names no shape it is translated to")
        self.shape = shape
        self.chat = shape.translated_to
        self.relay = relay

    def stream_error(self, intake: Intake, error: GatewayError) -> bytes:
        """The Responses stream's opening events and ``response.failed``."""
        return ResponsesTranslation(intake.payload, capped=False).stream_error(error)

    def before_admission(self, intake: Intake) -> Intake:
        """Nothing more to check before admission: the translation waits for the
        backend's own answer."""
        return intake

    async def send(self, call: Call, intake: Intake) -> Response | ASGIApp:
        """The backend's own ``/v1/responses`` where it is OpenAI-shaped (see
        ``OWN_RESPONSES_BACKENDS``) and the request needs no translation, unless it
        answers 404/422; otherwise the request converted to chat completions and the
        answer converted back. The request's bytes are built only for the backend's own
        route."""
        spec, payload, relay = call.spec, intake.payload, self.relay
        if spec.entry.backend in OWN_RESPONSES_BACKENDS and not needs_translation(payload):
            sender = relay.sender
            progress = sender.progress(call)
            probe, timer = await sender.open(call, self.shape.path, await intake.body(), progress)
            if probe.status_code not in RESPONSES_FALLBACK_STATUSES:
                return await relay.replies.reply(call, probe, timer, progress)
            timer.cancel()
            await probe.aclose()
        translated = translate_request(payload)  # presets were applied to the Responses body
        chat = translated.chat
        check_tool_calls(chat)  # the translation's own checks name the Responses fields
        call.exchange.dropped_tools = translated.dropped
        if call.watch_progress:  # the reports are the router's: the translation drops them
            chat["return_progress"] = True
        elif gather_stream(chat, self.chat, intake.reports):
            call.gathered = call.watch_progress = True
        apply_defaults(chat, self.chat, relay.sampling_defaults(spec))
        translation = ResponsesTranslation(payload, capped=call.capped)
        chat = await relay.guarded(call, chat, intake.alias, intake.reports, translation) or chat
        return await relay.relay(call, self.chat.path, dumps_body(chat), translation)


__all__ = [
    "OWN_RESPONSES_BACKENDS",
    "RESPONSES_FALLBACK_STATUSES",
    "ResponsesApi",
    "ResponsesTranslation",
]
