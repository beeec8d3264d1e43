"""Proxying one request to the backend its ``model`` names: take it in, refuse when the
supervisor says the backend cannot serve, admit it under its deadline, and hand the
call to its endpoint's handler (:mod:`~slm_server.router.apis.passthrough`,
:mod:`~slm_server.router.apis.responses.endpoint`,
:mod:`~slm_server.router.apis.messages.endpoint`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp

from slm_server.errors import BackendUnavailable
from slm_server.registry.schema import ModelSpec
from slm_server.router.answer.reply import Replies
from slm_server.router.apis.messages.endpoint import COUNT_TOKENS, MESSAGES, MessagesApi
from slm_server.router.apis.passthrough import PassThrough
from slm_server.router.apis.responses.endpoint import ResponsesApi
from slm_server.router.call.admission import Gate
from slm_server.router.call.admitted_call import Call, Deadline
from slm_server.router.call.backend_state import StateSource
from slm_server.router.call.drain import Drain
from slm_server.router.call.exchange import exchange_of
from slm_server.router.call.waits import client_of, running_loop
from slm_server.router.dispatch.choice import Choice
from slm_server.router.dispatch.lookup import Registry
from slm_server.router.intake.body_budget import BodyBudget
from slm_server.router.intake.memory_return import MemoryReturn
from slm_server.router.intake.payload import header_value, request_timeout
from slm_server.router.intake.reception import Intake, Reception
from slm_server.router.ondemand.loader import Loader
from slm_server.router.reload.in_force import InForce
from slm_server.router.reload.readiness import Readiness
from slm_server.router.upstream.client import Transport, forward_headers
from slm_server.router.upstream.sender import Sender
from slm_server.router.watchdog.tripwire import Tripwire
from slm_server.settings import Settings

RESPONSES = "/v1/responses"
# A replica that refused the connection never saw the request: it is sent to another.
UNREACHABLE = "backend_unreachable"


class Proxy:
    """The proxying handlers, bound to one registry, one upstream transport and the
    router's half of the watchdog."""

    def __init__(
        self,
        settings: Settings,
        registry: Registry,
        upstream: Transport,
        tripwire: Tripwire,
        states: StateSource,
        drain: Drain,
        gates: Mapping[str, Gate],
        in_force: InForce,
    ) -> None:
        serving = settings.serving
        self.gates = gates
        self.registry = registry
        self.choice = Choice(registry, states, gates)
        self.bodies = BodyBudget(serving.max_bodies_in_flight_bytes)
        self.memory_return = MemoryReturn()
        self.reception = Reception(registry, states, drain, serving.max_body_bytes)
        self.sender = Sender(upstream, tripwire, gates, serving.max_answer_bytes)
        replies = Replies(self.sender, drain, serving.max_sse_event_bytes)
        self.passthrough = PassThrough(self.sender, replies)
        self.responses_api = ResponsesApi(
            self.sender, replies, self.passthrough, self.reception.sampling_defaults
        )
        self.messages_api = MessagesApi(
            self.sender, replies, self.reception.sampling_defaults, self.server_kind
        )
        self.loader: Loader | None = None  # loading on demand, set by the app
        # Requests for backends a reload started wait for them, once routed by its registry.
        self.readiness = Readiness(states, self.sender.waits, in_force)
        self.choice.awaited = self.readiness.awaited

    def server_kind(self, spec: ModelSpec) -> str | None:
        """The server the launcher runs for ``spec`` ("llama-server", ...); None when no
        launcher has said."""
        planned = self.reception.states.planned(spec.role, spec.entry.port)
        return planned.kind if planned is not None else None

    def cancel_waiting(self) -> None:
        """End every request still waiting on a backend (the drain period is over)."""
        self.sender.cancel_waiting()

    async def proxy(self, request: Request) -> Response | ASGIApp:
        """``POST`` chat completions, completions, embeddings, rerank, image
        generations, and the multipart image edits and audio transcriptions."""
        return await self._serve(request, request.scope["path"])

    async def responses(self, request: Request) -> Response | ASGIApp:
        """``POST /v1/responses``: the backend's own, else translated to chat."""
        return await self._serve(request, RESPONSES)

    async def messages(self, request: Request) -> Response | ASGIApp:
        """``POST /v1/messages``: the Anthropic Messages API, translated to chat."""
        return await self._serve(request, MESSAGES)

    async def count_tokens(self, request: Request) -> Response | ASGIApp:
        """``POST /v1/messages/count_tokens``: llama-server's count, else an estimate."""
        return await self._serve(request, COUNT_TOKENS)

    async def _serve(self, request: Request, endpoint: str) -> Response | ASGIApp:
        """Take in, admit and proxy one request to ``endpoint``; its body counts
        against the budget for bodies in flight until the answer is handed back."""
        held = self.bodies.hold()
        try:
            exchange = exchange_of(request.scope)
            intake = await self.reception.take(request, endpoint, exchange, held)
            chat = None
            if endpoint in (MESSAGES, COUNT_TOKENS):  # refused before it waits for a slot
                counting = endpoint == COUNT_TOKENS
                chat = self.messages_api.prepare(intake.payload, intake.spec, counting)
                if endpoint == COUNT_TOKENS and not self.messages_api.counts_natively(intake.spec):
                    return self.messages_api.estimate(chat)
            entry = intake.spec.entry
            size = self.registry.size(intake.spec)
            seconds, shortened = request_timeout(
                entry.default_timeout, header_value(request.scope["headers"], b"x-request-timeout")
            )
            tried: list[str] = []  # replicas that refused the connection
            while True:
                spec = self.choice.choose(intake.spec, intake.payload, exchange, tried)
                if not tried:  # one deadline, however many replicas are tried
                    deadline = Deadline(seconds, running_loop().time)
                try:
                    return await self._send(
                        request, endpoint, intake, spec, deadline, shortened, chat
                    )
                except BackendUnavailable as error:
                    if error.code != UNREACHABLE or size == 1:
                        raise
                    tried.append(spec.role)
                    if len(tried) == size:
                        raise
        finally:
            size = held.size
            held.release()
            self.memory_return.released(size)

    async def _send(
        self,
        request: Request,
        endpoint: str,
        intake: Intake,
        spec: ModelSpec,
        deadline: Deadline,
        shortened: bool,
        chat: dict[str, Any] | None = None,
    ) -> Response | ASGIApp:
        """Admit the request to ``spec``'s backend and hand it to its handler (``chat``:
        a Messages request's translation)."""
        exchange = exchange_of(request.scope)
        client = client_of(request.scope, request.receive)
        intake = await self.reception.for_backend(intake, spec, endpoint)
        slot = await self.sender.admit(client, spec, exchange, deadline)
        try:
            if self.registry.holds(spec) and self.readiness.awaited(spec):
                # Holding the slot, as for a load: the line behind it keeps its order.
                # A request routed by the registry before a reload holds a slot of the
                # old gate instead, and is served by the old process, still alive until
                # retired: were it to wait, the old gate would not drain before its
                # deadline, nor the old process be retired, nor the new one start.
                await self.readiness.until_ready(spec, client, deadline.at)
                self.choice.refuse_if_down(spec)  # failed meanwhile, or restarting
            loader = self.loader
            if loader is not None and loader.on_demand(spec):
                # Holding the slot: the line behind it waits in order, within its limits.
                await loader.until_ready(spec, client, deadline.at)
            headers = forward_headers(request.scope["headers"])
            headers.update(exchange.upstream_headers)
            headers["x-request-id"] = exchange.request_id
            call = Call(
                request,
                spec,
                exchange,
                deadline,
                judged=not shortened,
                headers=headers,
                slot=slot,
                hidden_usage=intake.hidden_usage,
                capped=intake.capped,
            )
            if endpoint == RESPONSES:
                return await self.responses_api(call, intake.payload, intake.body)
            if chat is not None and endpoint == MESSAGES:
                return await self.messages_api.create(call, chat, intake.payload)
            if chat is not None:
                return await self.messages_api.count_tokens(call, chat, await intake.body())
            return await self.passthrough(call, endpoint, await intake.body())
        except BaseException:
            slot.release()
            raise


__all__ = ["Proxy"]
