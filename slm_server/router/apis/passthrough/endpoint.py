"""The endpoints proxied as they are — chat completions, completions, embeddings,
rerank, image generations, and the multipart image edits and audio transcriptions:
the request goes to the backend's own endpoint and its answer comes back."""

from __future__ import annotations

from starlette.responses import Response
from starlette.types import ASGIApp

from slm_server.contracts import engine_paths
from slm_server.errors import GatewayError
from slm_server.router.answer.chat_echo import ChatEcho
from slm_server.router.answer.relay import Relay
from slm_server.router.call.admitted_call import Call
from slm_server.router.call.shape import Shape
from slm_server.router.intake.reception import Intake
from slm_server.router.intake.strict_json import dumps_body


class PassThrough:
    """Sends a call's body to the backend's path of the same shape and answers with
    what comes back."""

    def __init__(self, shape: Shape, relay: Relay) -> None:
        self.shape = shape
        self.relay = relay

    def stream_error(self, intake: Intake, error: GatewayError) -> bytes:
        """OpenAI's in-band error event."""
        return error.sse_event()

    def before_admission(self, intake: Intake) -> Intake:
        """Nothing more to check: the intake's checks are the shape's."""
        return intake

    async def send(self, call: Call, intake: Intake) -> Response | ASGIApp:
        """The body (as the client sent it, or as the router changed it) to the backend;
        a chat request that offers tools with its calls settled
        (:mod:`slm_server.router.toolcalls`): its answer passed on as parsed."""
        if self.shape.path == engine_paths.CHAT and intake.payload.get("tools"):
            chat = intake.payload
            echo = ChatEcho(chat, hidden_usage=call.hidden_usage)
            sent = await self.relay.guarded(call, chat, intake.alias, intake.reports, echo)
            if sent is not None:
                body = await intake.body() if sent is chat else dumps_body(sent)
                return await self.relay.relay(call, self.shape.path, body, echo)
        return await self.relay.relay(call, self.shape.path, await intake.body())


__all__ = ["PassThrough"]
