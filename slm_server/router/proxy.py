"""Proxying one request to the backend its ``model`` names: prepare, refuse when the
supervisor says the backend cannot serve, send, judge the outcome for the watchdog,
and answer — whole, or relayed chunk by chunk."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Mapping
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp

from slm_server.config import ModelSpec
from slm_server.errors import (
    BackendProtocolError,
    BackendTimeout,
    BackendUnavailable,
    GatewayError,
    PayloadTooLarge,
)
from slm_server.registry import Registry
from slm_server.router.admission import Gate, Slot
from slm_server.router.answer import answer_fields
from slm_server.router.backend_state import StateSource
from slm_server.router.budget import BodyBudget, Held
from slm_server.router.drain import Drain
from slm_server.router.exchange import Exchange, exchange_of
from slm_server.router.forms import FORM_ENDPOINTS, read_form_fields
from slm_server.router.guard import Waits, client_of, running_loop
from slm_server.router.relay import StreamRelay
from slm_server.router.requests import (
    apply_defaults,
    ask_for_usage,
    check_fields,
    check_json_type,
    model_field,
    parse_body,
    request_timeout,
)
from slm_server.router.responses import (
    ResponseStreamTranslator,
    chat_to_response,
    responses_to_chat,
)
from slm_server.router.sse import SseTap
from slm_server.router.strict_json import dumps_body
from slm_server.router.upstream import (
    RETRY_AFTER_SECONDS,
    Transport,
    UpstreamResponse,
    backend_error_body,
    content_encoding,
    forward_headers,
    iter_bounded,
    iter_raw,
    iter_sse,
    read_all,
)
from slm_server.settings import Settings
from slm_server.supervise.classify import HEALTHY, classify_status, outcome_of
from slm_server.supervise.tripwire import Progress, StallTimer, Tripwire

RESPONSES_FALLBACK_STATUSES = frozenset({404, 422})
# Backends whose own /v1/responses is asked first. llama-server's (at the pinned
# release, and llama-cpp-python has none) is not OpenAI-shaped: its events lack
# sequence_number and most output/content indexes, response.created lacks created_at,
# model and tools, a cut answer says completed; the openai SDK's responses.stream()
# fails on it. For llama.cpp backends the router translates to chat completions itself.
OWN_RESPONSES_BACKENDS = frozenset({"mlx"})
# Bodies larger than this are parsed and re-serialised in a thread: 30 MiB of JSON
# takes the better part of a second, which would stall every other request.
OFF_LOOP_BYTES = 1024 * 1024
_T = TypeVar("_T")


class Proxy:
    """The proxying handlers, bound to one registry, one set of upstream clients and
    the router's half of the watchdog."""

    def __init__(
        self,
        settings: Settings,
        registry: Registry,
        upstream: Transport,
        tripwire: Tripwire,
        states: StateSource,
        drain: Drain,
        gates: Mapping[str, Gate],
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.upstream = upstream
        self.tripwire = tripwire
        self.states = states
        self.drain = drain
        self.gates = gates
        self.max_body = settings.serving.max_body_bytes
        self.max_answer = settings.serving.max_answer_bytes
        self.bodies = BodyBudget(settings.serving.max_bodies_in_flight_bytes)
        self.max_event = settings.serving.max_sse_event_bytes
        self.waits = Waits()

    def sampling_defaults(self, spec: ModelSpec) -> dict[str, Any]:
        """The request fields the launcher published for this backend (the Python
        fallback's sampling defaults); none without a running launcher."""
        planned = self.states.planned(spec.role, spec.entry.port)
        return dict(planned.request_defaults) if planned is not None else {}

    async def _body(self, request: Request, held: Held) -> bytes:
        """The request body, refused with 413 past ``SLM_MAX_BODY_MB`` and with 503 past
        the budget for bodies in flight; both on ``Content-Length`` before reading."""
        limit = self.max_body
        declared = request.headers.get("content-length")
        too_large = PayloadTooLarge(
            f"The request body is larger than the router's limit of {limit} bytes (SLM_MAX_BODY_MB)"
        )
        stated = int(declared) if declared is not None and declared.isdigit() else None
        if stated is not None and stated > limit:
            raise too_large
        if stated is not None:
            held.take(stated)
        parts: list[bytes] = []
        size = 0
        async for part in request.stream():
            size += len(part)
            if size > limit:
                raise too_large
            if stated is None or size > stated:
                held.take(len(part))
            parts.append(part)
        return b"".join(parts)

    async def _prepare(
        self, request: Request, endpoint: str, exchange: Exchange, held: Held
    ) -> tuple[ModelSpec, dict[str, Any], bytes, bool]:
        if self.drain.draining:
            raise BackendUnavailable(
                "The router is shutting down and takes no new requests",
                code="shutting_down",
                retry_after=RETRY_AFTER_SECONDS,
            )
        if endpoint not in FORM_ENDPOINTS:
            check_json_type(request.headers.get("content-type"))
        raw = await self._body(request, held)
        if endpoint in FORM_ENDPOINTS:
            # Only read for its routing fields: the form goes upstream byte for byte.
            content_type = request.headers.get("content-type")
            payload = await read_form_fields(raw, content_type)
        elif len(raw) > OFF_LOOP_BYTES:  # a large body is parsed off the event loop
            payload = await asyncio.to_thread(parse_body, raw)
        else:
            payload = parse_body(raw)
        exchange.note_request(payload)
        spec = self.registry.route(model_field(payload), endpoint)
        exchange.spec = spec
        check_fields(payload, endpoint)
        changed = apply_defaults(payload, spec.entry, endpoint, self.sampling_defaults(spec))
        hidden_usage = ask_for_usage(payload, endpoint)
        if changed or hidden_usage:
            large = len(raw) > OFF_LOOP_BYTES
            raw = await asyncio.to_thread(dumps_body, payload) if large else dumps_body(payload)
        return spec, payload, raw, hidden_usage

    def _refuse_if_down(self, spec: ModelSpec) -> None:
        """Answer for the supervisor when it says the backend cannot serve: abandoned
        or failed (503, with why), or (re)starting (503 with ``Retry-After``). These are
        the router's own refusals, never counted against the backend."""
        state = self.states.get(spec.role, spec.entry.port)
        if state is None or not self.states.launcher_alive():
            return
        name = f"The backend for '{spec.entry.id}'"
        if state.state in ("abandoned", "failed"):
            verb = "was abandoned by the watchdog" if state.state == "abandoned" else "failed"
            raise BackendUnavailable(
                f"{name} {verb}: {state.reason or 'no reason recorded'}",
                code=f"backend_{state.state}",
            )
        if state.state in ("starting", "restarting"):
            why = f" ({state.reason})" if state.reason else ""
            raise BackendUnavailable(
                f"{name} is {state.state}{why}; retry shortly",
                code=f"backend_{state.state}",
                retry_after=RETRY_AFTER_SECONDS,
            )

    def _headers(self, request: Request, exchange: Exchange) -> dict[str, str]:
        headers = forward_headers(request.headers)
        headers.update(exchange.upstream_headers)
        headers["x-request-id"] = exchange.request_id
        return headers

    async def _open(
        self,
        spec: ModelSpec,
        path: str,
        body: bytes,
        headers: dict[str, str],
        exchange: Exchange,
    ) -> tuple[UpstreamResponse, StallTimer]:
        """Send the request; streams get a first-byte stall timer armed before sending."""
        timer = self.tripwire.stall_timer(spec) if exchange.stream else StallTimer(None)
        started = time.perf_counter()
        try:
            return await self.upstream.open(spec, path, body, headers), timer
        except GatewayError as error:
            timer.cancel()
            self.tripwire.observe(spec, outcome_of(error), error.message)
            raise
        except BaseException:
            timer.cancel()
            raise
        finally:
            exchange.upstream_seconds += time.perf_counter() - started

    async def _read(
        self,
        spec: ModelSpec,
        upstream: UpstreamResponse,
        exchange: Exchange,
        progress: Progress | None = None,
    ) -> bytes:
        """The whole body, with the outcome judged by the watchdog; read piece by piece,
        each piece noted in ``progress``, when there is one."""
        started = time.perf_counter()
        try:
            if progress is None:
                content = await read_all(spec, upstream, self.max_answer)
            else:
                content = await self._gather(spec, upstream, progress)
        except GatewayError as error:
            self.tripwire.observe(spec, outcome_of(error), error.message)
            raise
        finally:
            exchange.upstream_seconds += time.perf_counter() - started
        self.tripwire.observe(spec, classify_status(upstream.status_code))
        return content

    async def _gather(
        self, spec: ModelSpec, upstream: UpstreamResponse, progress: Progress
    ) -> bytes:
        """The whole body, piece by piece as it arrives (the caller closes ``upstream``)."""
        parts: list[bytes] = []
        progress.waiting(time.perf_counter())
        async for part in iter_bounded(spec, upstream, self.max_answer):
            progress.arrived()
            parts.append(part)
            progress.waiting(time.perf_counter())
        return b"".join(parts)

    async def _watched(
        self,
        spec: ModelSpec,
        chunks: AsyncIterator[_T],
        timer: StallTimer,
        exchange: Exchange,
        progress: Progress,
    ) -> AsyncIterator[_T]:
        """``chunks`` as they come, each noted in ``progress``; the first one clears the
        stall timer and counts as health, a transport failure counts against the
        backend."""
        iterator = aiter(chunks)
        try:
            while True:
                started = time.perf_counter()
                # Left set when a cut cancels the wait: the deadline is judged after.
                progress.waiting(started)
                try:
                    chunk = await anext(iterator)
                except StopAsyncIteration:
                    return
                finally:
                    exchange.upstream_seconds += time.perf_counter() - started
                progress.arrived()
                if exchange.first_chunk is None:
                    timer.first_byte()
                    self.tripwire.observe(spec, HEALTHY)
                exchange.note_chunk()
                yield chunk
        except GatewayError as error:
            exchange.error_type = error.code
            self.tripwire.observe(spec, outcome_of(error), error.message)
            raise
        finally:
            timer.cancel()

    async def _tapped(self, chunks: AsyncIterator[bytes], tap: SseTap) -> AsyncIterator[bytes]:
        async for chunk in chunks:
            forward = tap.feed(chunk)
            if forward:
                yield forward
        rest = tap.flush()
        if rest:
            yield rest
        if tap.error is not None:
            tap.exchange.error_type = "backend_stream_error"

    async def _admit(
        self, request: Request, spec: ModelSpec, exchange: Exchange, timeout: float
    ) -> Slot:
        """Wait for an admission slot; the wait counts against the deadline, and a
        client that leaves while queued gives up its place at once."""
        gate = self.gates[spec.role]
        started = time.perf_counter()
        try:
            # The gate enforces the deadline itself (a 504 never counted against the
            # backend); the guard's own limit is only a backstop behind it. A free slot
            # is taken at once, with nothing to guard.
            if not gate.try_acquire():
                await self._guard(request, gate.acquire(timeout), timeout + 1.0, spec, None)
        finally:
            exchange.queue_seconds = time.perf_counter() - started
        return Slot(gate)

    async def _guard(
        self,
        request: Request,
        work: Awaitable[_T],
        timeout: float,
        spec: ModelSpec,
        progress: Progress | None,
    ) -> _T:
        """``work`` under the deadline, the client's presence and the drain. A deadline
        that is the model's own is judged by the watchdog from ``progress``; None when
        the deadline is not the backend's to answer for (the caller shortened it, or
        the request is still queued)."""
        try:
            return await self.waits.run(client_of(request.scope, request.receive), work, timeout)
        except TimeoutError:
            error = BackendTimeout(
                f"The backend for '{spec.entry.id}' did not answer within the request's "
                f"deadline of {timeout:.3g}s",
                code="deadline_exceeded",
            )
            self._judge_deadline(spec, progress, error)
            raise error from None

    def _judge_deadline(
        self, spec: ModelSpec, progress: Progress | None, error: GatewayError
    ) -> None:
        if progress is not None:
            self.tripwire.deadline(spec, progress, time.perf_counter(), error.message)

    def cancel_waiting(self) -> None:
        """End every request still waiting on a backend (the drain period is over)."""
        self.waits.cancel_all()

    async def _exchange(
        self,
        request: Request,
        spec: ModelSpec,
        exchange: Exchange,
        path: str,
        body: bytes,
        headers: dict[str, str],
        hidden_usage: bool,
        timeout: float,
        shortened: bool,
        slot: Slot,
        translate: dict[str, Any] | None = None,
    ) -> Response | ASGIApp:
        """Send one request upstream under the deadline and answer with its response.
        The slot is released when the answer is complete (for a stream: when the relay
        ends, however it ends)."""
        loop_deadline = running_loop().time() + timeout
        progress = None if shortened else Progress(time.perf_counter())
        upstream, timer = await self._guard(
            request, self._open(spec, path, body, headers, exchange), timeout, spec, progress
        )
        return await self._reply(
            request,
            spec,
            exchange,
            upstream,
            timer,
            hidden_usage,
            loop_deadline,
            progress,
            slot,
            translate,
        )

    async def _reply(
        self,
        request: Request,
        spec: ModelSpec,
        exchange: Exchange,
        upstream: UpstreamResponse,
        timer: StallTimer,
        hidden_usage: bool,
        loop_deadline: float,
        progress: Progress | None,
        slot: Slot,
        translate: dict[str, Any] | None = None,
    ) -> Response | ASGIApp:
        """Answer with an opened upstream response: relayed when it streams, else read
        whole under the deadline (and converted when ``translate`` is the original
        Responses-API request). ``progress`` notes what the backend delivers, for the
        watchdog to judge a deadline that cuts the answer; None when the client
        shortened the deadline (it is never judged)."""
        content_type = upstream.headers.get("content-type", "application/json")
        streams = upstream.status_code == 200 and "event-stream" in content_type
        noted = progress if progress is not None else Progress(time.perf_counter())

        def on_cut(error: GatewayError) -> None:
            exchange.error_type = error.code
            if error.code == "deadline_exceeded":
                self._judge_deadline(spec, progress, error)

        async def close() -> None:
            try:
                await upstream.aclose()
            finally:
                slot.release()

        encoding = content_encoding(upstream)
        if encoding is not None and translate is not None:
            timer.cancel()
            await close()
            raise BackendProtocolError(
                f"The backend for '{spec.entry.id}' sent a {encoding}-encoded answer, "
                "which the router cannot translate to the Responses API",
                code="upstream_encoded",
            )
        if exchange.stream and streams and translate is None:
            chunks = self._watched(spec, iter_raw(spec, upstream), timer, exchange, noted)
            if encoding is not None:  # the bytes as they came: the client decodes them
                return StreamRelay(
                    chunks,
                    close,
                    media_type=content_type,
                    headers={"content-encoding": encoding},
                    deadline=loop_deadline,
                    drain=self.drain,
                    on_cut=on_cut,
                )
            tap = SseTap(exchange, drop_usage_chunk=hidden_usage, max_event_bytes=self.max_event)
            return StreamRelay(
                self._tapped(chunks, tap),
                close,
                media_type=content_type,
                deadline=loop_deadline,
                drain=self.drain,
                on_cut=on_cut,
            )
        if exchange.stream and streams and translate is not None:
            translator = ResponseStreamTranslator(translate)
            events = self._watched(
                spec, iter_sse(spec, upstream, self.max_event), timer, exchange, noted
            )
            return StreamRelay(
                self._translated(events, translator, exchange),
                close,
                error_event=lambda error: b"".join(translator.error(error.message)),
                deadline=loop_deadline,
                drain=self.drain,
                on_cut=on_cut,
            )
        timer.cancel()
        try:
            if upstream.complete:  # the body is in already: nothing to wait for
                content = await self._read(spec, upstream, exchange)
            else:
                remaining = loop_deadline - running_loop().time()
                reading = self._read(spec, upstream, exchange, noted)
                content = await self._guard(request, reading, remaining, spec, progress)
        finally:
            await close()
        if encoding is not None:  # passed on with the encoding it needs to be read
            return Response(
                content,
                status_code=upstream.status_code,
                media_type=content_type,
                headers={"content-encoding": encoding},
            )
        if upstream.status_code >= 400:
            return Response(
                backend_error_body(upstream.status_code, content),
                status_code=upstream.status_code,
                media_type="application/json",
            )
        body_json: Any = None
        if "json" in content_type and translate is not None:
            try:
                body_json = json.loads(content)
            except (ValueError, RecursionError):
                body_json = None
        elif "json" in content_type:
            body_json = answer_fields(content)  # only for the record: floats kept as text
        if translate is not None:
            if not isinstance(body_json, dict):
                return Response(
                    backend_error_body(502, content), 502, media_type="application/json"
                )
            result = chat_to_response(body_json, translate)
            exchange.note_response(result)
            return JSONResponse(result)
        if isinstance(body_json, dict):
            exchange.note_response(body_json)
        return Response(content, status_code=upstream.status_code, media_type=content_type)

    async def _serve(self, request: Request, endpoint: str) -> Response | ASGIApp:
        """Prepare, admit and proxy one request to ``endpoint``."""
        held = self.bodies.hold()
        try:
            return await self._serve_held(request, endpoint, held)
        finally:
            held.release()

    async def _serve_held(self, request: Request, endpoint: str, held: Held) -> Response | ASGIApp:
        exchange = exchange_of(request.scope)
        spec, payload, raw, hidden_usage = await self._prepare(request, endpoint, exchange, held)
        self._refuse_if_down(spec)
        timeout, shortened = request_timeout(
            spec.entry.default_timeout, request.headers.get("x-request-timeout")
        )
        started = time.monotonic()
        slot = await self._admit(request, spec, exchange, timeout)
        try:
            headers = self._headers(request, exchange)
            remaining = timeout - (time.monotonic() - started)
            if endpoint != "/v1/responses":
                return await self._exchange(
                    request,
                    spec,
                    exchange,
                    endpoint,
                    raw,
                    headers,
                    hidden_usage,
                    remaining,
                    shortened,
                    slot,
                )
            return await self._responses(
                request,
                spec,
                exchange,
                payload,
                raw,
                headers,
                timeout,
                started,
                shortened,
                slot,
            )
        except BaseException:
            slot.release()
            raise

    async def _responses(
        self,
        request: Request,
        spec: ModelSpec,
        exchange: Exchange,
        payload: dict[str, Any],
        raw: bytes,
        headers: dict[str, str],
        timeout: float,
        started: float,
        shortened: bool,
        slot: Slot,
    ) -> Response | ASGIApp:
        """The backend's own ``/v1/responses`` where it is OpenAI-shaped (see
        ``OWN_RESPONSES_BACKENDS``), unless it answers 404/422; otherwise the request
        converted to chat completions and the answer converted back."""
        if spec.entry.backend in OWN_RESPONSES_BACKENDS:
            remaining = timeout - (time.monotonic() - started)
            progress = None if shortened else Progress(time.perf_counter())
            probe, timer = await self._guard(
                request,
                self._open(spec, "/v1/responses", raw, headers, exchange),
                remaining,
                spec,
                progress,
            )
            if probe.status_code not in RESPONSES_FALLBACK_STATUSES:
                loop_deadline = running_loop().time() + (timeout - (time.monotonic() - started))
                return await self._reply(
                    request, spec, exchange, probe, timer, False, loop_deadline, progress, slot
                )
            timer.cancel()
            await probe.aclose()
        chat = responses_to_chat(payload)
        apply_defaults(chat, spec.entry, "/v1/chat/completions", self.sampling_defaults(spec))
        return await self._exchange(
            request,
            spec,
            exchange,
            "/v1/chat/completions",
            dumps_body(chat),
            headers,
            False,
            timeout - (time.monotonic() - started),
            shortened,
            slot,
            translate=payload,
        )

    async def proxy(self, request: Request) -> Response | ASGIApp:
        """``POST`` chat completions, completions, embeddings, rerank, image
        generations, and the multipart image edits and audio transcriptions."""
        return await self._serve(request, request.url.path)

    async def responses(self, request: Request) -> Response | ASGIApp:
        """``POST /v1/responses``: the backend's own, else translated to chat."""
        return await self._serve(request, "/v1/responses")

    async def _translated(
        self,
        chunks: AsyncIterator[dict[str, Any]],
        translator: ResponseStreamTranslator,
        exchange: Exchange,
    ) -> AsyncIterator[bytes]:
        for event in translator.start():
            yield event
        async for chunk in chunks:
            exchange.note_response(chunk)
            error = chunk.get("error")
            if error is not None:
                message = error.get("message") if isinstance(error, dict) else str(error)
                exchange.error_type = "backend_stream_error"
                for event in translator.error(str(message)):
                    yield event
                return
            for event in translator.feed(chunk):
                yield event
        for event in translator.finish():
            yield event
