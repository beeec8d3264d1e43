"""The one orchestrator: a request in one of the API shapes of the table
(:mod:`~slm_server.router.apis.table`) taken in, checked by its shape's endpoint, a
backend chosen (refused when the supervisor says none can serve), admitted under its
deadline, waited for when it is loading, and handed to the endpoint to send."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from slm_server.errors import BackendUnavailable, GatewayError
from slm_server.registry.infill import InfillCache
from slm_server.registry.schema import ModelSpec
from slm_server.router.answer.in_band import InBand, going_on
from slm_server.router.answer.relay import Relay
from slm_server.router.answer.reply import Replies
from slm_server.router.answer.stream_relay import StreamRelay
from slm_server.router.apis.table import TABLE, Endpoint
from slm_server.router.call.admission import Gate
from slm_server.router.call.admitted_call import Call, Deadline
from slm_server.router.call.backend_state import StateSource
from slm_server.router.call.drain import Drain
from slm_server.router.call.exchange import LOADING, RESTARTING, SENT, Exchange, exchange_of
from slm_server.router.call.keepalive import PROGRESS_HEADER, Heartbeat, KeepAlive, asks_progress
from slm_server.router.call.shape import Shape
from slm_server.router.call.waits import client_of, running_loop
from slm_server.router.dispatch.choice import Choice
from slm_server.router.dispatch.lookup import Registry
from slm_server.router.dispatch.recovery import Recovery
from slm_server.router.intake.body_budget import BodyBudget
from slm_server.router.intake.memory_return import MemoryReturn
from slm_server.router.intake.payload import header_value, request_timeout
from slm_server.router.intake.reception import Intake, Reception
from slm_server.router.ondemand.loader import Loader
from slm_server.router.reload.in_force import InForce
from slm_server.router.reload.readiness import Readiness
from slm_server.router.toolcalls.template_caps import TemplateCaps
from slm_server.router.upstream.client import Transport, forward_headers
from slm_server.router.upstream.sender import Sender
from slm_server.router.watchdog.tripwire import Tripwire
from slm_server.settings import Settings

Handler = Callable[[Request], Awaitable[Response | ASGIApp]]
# A replica that refused the connection never saw the request: it is sent to another.
UNREACHABLE = "backend_unreachable"


class Proxy:
    """The handlers of the API shapes of the table, bound to one registry, one upstream
    transport and the router's half of the watchdog."""

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
        self.keepalive_seconds = serving.keepalive_seconds
        self.memory_return = MemoryReturn()
        self.reception = Reception(registry, states, drain, serving.max_body_bytes)
        self.sender = Sender(upstream, tripwire, gates, serving.max_answer_bytes)
        replies = Replies(self.sender, drain, serving.max_sse_event_bytes)
        recovery = Recovery(states, self.sender.waits)
        # Whether each backend's template takes tools, asked once per process; shared
        # with GET /v1/models.
        self.caps = TemplateCaps(upstream, states)
        self.infill = InfillCache()  # whether each model fills in the middle, likewise
        relay = Relay(
            self.sender,
            replies,
            self.reception.sampling_defaults,
            self.server_kind,
            recovery,
            self.caps,
            self.keep_alive,
            self.infill,
        )
        # Each row's endpoint, built once, by its shape.
        self.endpoints: dict[Shape, Endpoint] = {
            row.shape: row.endpoint(row.shape, relay) for row in TABLE
        }
        self.loader: Loader | None = None  # loading on demand, set by the app
        # Requests for backends a reload started wait for them, once routed by its registry.
        self.readiness = Readiness(states, self.sender.waits, in_force)
        self.choice.awaited = self.readiness.awaited

    def server_kind(self, spec: ModelSpec) -> str | None:
        """The server the launcher runs for ``spec`` ("llama-server", ...); None when no
        launcher has said."""
        planned = self.reception.states.planned(spec.role, spec.entry.port)
        return planned.kind if planned is not None else None

    def keep_alive(self, spec: ModelSpec, seconds: float | None) -> None:
        """Keep ``spec``'s on-demand model loaded ``seconds`` after its last request
        (None: as its entry says); nothing for a model loaded for good."""
        if self.loader is not None:
            self.loader.keep_alive(spec, seconds)

    def cancel_waiting(self) -> None:
        """End every request still waiting on a backend (the drain period is over)."""
        self.sender.cancel_waiting()

    def handler(self, shape: Shape) -> Handler:
        """The handler of requests in ``shape`` (at its path)."""
        endpoint = self.endpoints[shape]

        async def serve(request: Request) -> Response | ASGIApp:
            return _Serving(self, request, shape, endpoint)

        serve.__doc__ = f"``POST {shape.path}``"
        return serve

    async def _serve(
        self, request: Request, shape: Shape, endpoint: Endpoint, send: Send
    ) -> Response | ASGIApp:
        """Take in, admit and proxy one request in ``shape``; its body counts against
        the budget for bodies in flight until the answer is handed back. A streamed
        request that waits is sent keep-alives meanwhile (through ``send``)."""
        held = self.bodies.hold()
        try:
            exchange = exchange_of(request.scope)
            taken = await self.reception.take(request, shape, exchange, held)
            checked = endpoint.before_admission(taken)  # refused before it waits for a slot
            if isinstance(checked, Response):  # answered without a backend
                return checked
            intake = checked
            keepalive = self._keepalive(request, shape, exchange)
            if keepalive is None:
                return await self._route(request, shape, endpoint, intake, None)
            return await self._beating(request, shape, endpoint, intake, keepalive, send)
        finally:
            size = held.size
            held.release()
            self.memory_return.released(size)

    async def _beating(
        self,
        request: Request,
        shape: Shape,
        endpoint: Endpoint,
        intake: Intake,
        keepalive: KeepAlive,
        send: Send,
    ) -> Response | ASGIApp:
        """Route a streamed request with its keep-alives going out while it waits; an
        answer that comes after its head went out goes on from there, or is told in
        band."""
        exchange = keepalive.exchange
        beat = Heartbeat(send, keepalive, running_loop())
        beat.arm()
        try:
            answer = await self._route(request, shape, endpoint, intake, keepalive)
        except GatewayError as error:
            if not await beat.stop():
                raise
            exchange.note_error(error)
            return InBand(endpoint.stream_error(intake, error))
        except BaseException:
            beat.cancel()
            raise
        relay = answer if isinstance(answer, StreamRelay) else None
        if relay is not None and relay.on_head is not None:
            relay.on_head(False)  # a beat going out to the client holds the answer up
        started = await beat.stop()
        if relay is not None and relay.on_head is not None:
            relay.on_head(True)
        if not started:
            return answer
        going = going_on(answer)
        if isinstance(going, GatewayError):
            if relay is not None:
                await relay.close()  # the backend's response and the slot
            exchange.note_error(going)
            return InBand(endpoint.stream_error(intake, going))
        return going

    def _keepalive(self, request: Request, shape: Shape, exchange: Exchange) -> KeepAlive | None:
        """What a streamed request's client is sent while it waits; None for a
        request that does not stream, or with keep-alives off."""
        streams_tokens = shape.token_stream or shape.translated_to is not None
        if (
            not (exchange.stream and shape.streams and streams_tokens)
            or self.keepalive_seconds <= 0
            or shape.keepalive is None
        ):
            return None
        report = asks_progress(header_value(request.scope["headers"], PROGRESS_HEADER))
        return KeepAlive(self.keepalive_seconds, shape.keepalive, exchange, report)

    async def _route(
        self,
        request: Request,
        shape: Shape,
        endpoint: Endpoint,
        intake: Intake,
        keepalive: KeepAlive | None,
    ) -> Response | ASGIApp:
        """Choose the backend (another replica when one refuses the connection) and
        send the request to it, under one deadline."""
        exchange = exchange_of(request.scope)
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
                    request, shape, endpoint, intake, spec, deadline, shortened, keepalive
                )
            except BackendUnavailable as error:
                if error.code != UNREACHABLE or size == 1:
                    raise
                tried.append(spec.role)
                if len(tried) == size:
                    raise

    async def _send(
        self,
        request: Request,
        shape: Shape,
        endpoint: Endpoint,
        intake: Intake,
        spec: ModelSpec,
        deadline: Deadline,
        shortened: bool,
        keepalive: KeepAlive | None,
    ) -> Response | ASGIApp:
        """Admit the request to ``spec``'s backend and hand it to its endpoint."""
        exchange = exchange_of(request.scope)
        client = client_of(request.scope, request.receive)
        intake = await self.reception.for_backend(intake, spec, shape)
        slot = await self.sender.admit(client, spec, exchange, deadline)
        try:
            if self.registry.holds(spec) and self.readiness.awaited(spec):
                # Holding the slot, as for a load: the line behind it keeps its order.
                # A request routed by the registry before a reload holds a slot of the
                # old gate instead, and is served by the old process, still alive until
                # retired: were it to wait, the old gate would not drain before its
                # deadline, nor the old process be retired, nor the new one start.
                waited_from = time.perf_counter()
                exchange.enter(RESTARTING)
                await self.readiness.until_ready(spec, client, deadline.at)
                exchange.recovery = "waited"
                exchange.recovery_seconds = time.perf_counter() - waited_from
                self.choice.refuse_if_down(spec)  # failed meanwhile, or restarting
            loader = self.loader
            if loader is not None and loader.on_demand(spec):
                # Holding the slot: the line behind it waits in order, within its limits.
                exchange.enter(LOADING)
                loading_from = time.perf_counter()
                try:
                    await loader.until_ready(spec, client, deadline.at)
                finally:  # a load that failed was waited for all the same
                    exchange.load_seconds = time.perf_counter() - loading_from
            headers = forward_headers(request.scope["headers"])
            headers.update(exchange.upstream_headers)
            headers["x-request-id"] = exchange.request_id
            call = Call(
                request,
                spec,
                exchange,
                deadline,
                # A raw request's deadline is never the backend's to answer for.
                judged=not shortened and not shape.raw,
                headers=headers,
                slot=slot,
                hidden_usage=intake.hidden_usage,
                capped=intake.capped,
                watch_progress=intake.watch_progress,
                hidden_progress=intake.hidden_progress,
                keepalive=keepalive,
                gathered=intake.gathered,
            )
            exchange.enter(SENT)
            return await endpoint.send(call, intake)
        except BaseException:
            slot.release()
            raise


class _Serving:
    """The answer to one request in one API shape: the proxy serves it given the ASGI
    ``send`` (which its keep-alives need), then the answer it made is sent."""

    __slots__ = ("endpoint", "proxy", "request", "shape")

    def __init__(self, proxy: Proxy, request: Request, shape: Shape, endpoint: Endpoint) -> None:
        self.proxy = proxy
        self.request = request
        self.shape = shape
        self.endpoint = endpoint

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        answer = await self.proxy._serve(self.request, self.shape, self.endpoint, send)
        await answer(scope, receive, send)


__all__ = ["Proxy"]
