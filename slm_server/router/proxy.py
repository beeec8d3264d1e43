"""Proxying one request to the backend its ``model`` names: prepare, refuse when the
supervisor says the backend cannot serve, send, judge the outcome for the watchdog,
and answer — whole, or relayed chunk by chunk."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any, TypeVar

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp

from slm_server.config import ModelSpec
from slm_server.errors import BackendTimeout, BackendUnavailable, GatewayError
from slm_server.launch.llama_argv import python_request_defaults
from slm_server.registry import Registry
from slm_server.router.backend_state import StateView
from slm_server.router.exchange import Exchange, exchange_of
from slm_server.router.relay import StreamRelay
from slm_server.router.requests import apply_defaults, is_stream, model_field, parse_body
from slm_server.router.responses import (
    ResponseStreamTranslator,
    chat_to_response,
    responses_to_chat,
)
from slm_server.router.sse import SseTap
from slm_server.router.upstream import RETRY_AFTER_SECONDS, Upstream, forward_headers
from slm_server.settings import Settings
from slm_server.supervise.classify import (
    BROKEN,
    HEALTHY,
    TIMED_OUT,
    UNREACHABLE,
    Outcome,
    classify_status,
)
from slm_server.supervise.tripwire import StallTimer, Tripwire

RESPONSES_FALLBACK_STATUSES = frozenset({404, 422})
USAGE_STREAM_ENDPOINTS = frozenset({"/v1/chat/completions", "/v1/completions"})
_T = TypeVar("_T")


def backend_error_body(status: int, content: bytes) -> bytes:
    """A backend's error body, wrapped in the OpenAI shape when it is not already."""
    try:
        parsed = json.loads(content)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict | str):
        return content
    message = content.decode("utf-8", "replace").strip()[:2000] or f"HTTP {status}"
    return json.dumps(
        {"error": {"message": message, "type": "backend_error", "code": status, "param": None}}
    ).encode()


def outcome_of(error: GatewayError) -> Outcome:
    """The watchdog's verdict on a transport failure talking to a backend."""
    if isinstance(error, BackendTimeout):
        return TIMED_OUT
    if isinstance(error, BackendUnavailable):
        return UNREACHABLE
    return BROKEN


def ask_for_usage(payload: dict[str, Any], endpoint: str) -> bool:
    """Ask a streaming backend to end with a usage chunk; True when the client did not
    ask for it itself (so that chunk is kept from it)."""
    if endpoint not in USAGE_STREAM_ENDPOINTS or not is_stream(payload):
        return False
    options = payload.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        return False
    merged = dict(options) if isinstance(options, dict) else {}
    merged["include_usage"] = True
    payload["stream_options"] = merged
    return True


class Proxy:
    """The proxying handlers, bound to one registry, one set of upstream clients and
    the router's half of the watchdog."""

    def __init__(
        self,
        settings: Settings,
        registry: Registry,
        upstream: Upstream,
        python_llama: bool,
        tripwire: Tripwire,
        states: StateView,
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.upstream = upstream
        self.python_llama = python_llama
        self.tripwire = tripwire
        self.states = states

    def sampling_defaults(self, spec: ModelSpec) -> dict[str, Any]:
        if spec.entry.backend == "llamacpp" and self.python_llama:
            return python_request_defaults(spec.entry)
        return {}

    async def _prepare(
        self, request: Request, endpoint: str, exchange: Exchange
    ) -> tuple[ModelSpec, dict[str, Any], bytes, bool]:
        raw = await request.body()
        payload = parse_body(raw)
        exchange.note_request(payload)
        spec = self.registry.route(model_field(payload), endpoint)
        exchange.spec = spec
        changed = apply_defaults(payload, spec.entry, endpoint, self.sampling_defaults(spec))
        hidden_usage = ask_for_usage(payload, endpoint)
        if changed or hidden_usage:
            raw = json.dumps(payload).encode()
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
    ) -> tuple[httpx.Response, StallTimer]:
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

    async def _read(self, spec: ModelSpec, upstream: httpx.Response, exchange: Exchange) -> bytes:
        """The whole body, with the outcome judged by the watchdog."""
        started = time.perf_counter()
        try:
            content = await self.upstream.read(spec, upstream)
        except GatewayError as error:
            self.tripwire.observe(spec, outcome_of(error), error.message)
            raise
        finally:
            exchange.upstream_seconds += time.perf_counter() - started
        self.tripwire.observe(spec, classify_status(upstream.status_code))
        return content

    async def _watched(
        self,
        spec: ModelSpec,
        chunks: AsyncIterator[_T],
        timer: StallTimer,
        exchange: Exchange,
    ) -> AsyncIterator[_T]:
        """``chunks`` as they come; the first one clears the stall timer and counts as
        health, a transport failure counts against the backend."""
        iterator = aiter(chunks)
        try:
            while True:
                started = time.perf_counter()
                try:
                    chunk = await anext(iterator)
                except StopAsyncIteration:
                    return
                finally:
                    exchange.upstream_seconds += time.perf_counter() - started
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

    async def _answer(
        self,
        spec: ModelSpec,
        upstream: httpx.Response,
        timer: StallTimer,
        exchange: Exchange,
        hidden_usage: bool = False,
    ) -> Response | ASGIApp:
        """Answer with the backend's response: relayed if it streams, else whole."""
        content_type = upstream.headers.get("content-type", "application/json")
        if exchange.stream and upstream.status_code == 200 and "event-stream" in content_type:
            chunks = self._watched(spec, self.upstream.iter_raw(spec, upstream), timer, exchange)
            tap = SseTap(exchange, drop_usage_chunk=hidden_usage)
            return StreamRelay(self._tapped(chunks, tap), upstream.aclose, media_type=content_type)
        timer.cancel()
        content = await self._read(spec, upstream, exchange)
        if upstream.status_code >= 400:
            content = backend_error_body(upstream.status_code, content)
            content_type = "application/json"
        elif "json" in content_type:
            try:
                body = json.loads(content)
            except ValueError:
                body = None
            if isinstance(body, dict):
                exchange.note_response(body)
        return Response(content, status_code=upstream.status_code, media_type=content_type)

    async def proxy(self, request: Request) -> Response | ASGIApp:
        """``POST`` chat completions, completions, embeddings and rerank."""
        endpoint = request.url.path
        exchange = exchange_of(request.scope)
        spec, _payload, raw, hidden_usage = await self._prepare(request, endpoint, exchange)
        self._refuse_if_down(spec)
        headers = self._headers(request, exchange)
        upstream, timer = await self._open(spec, endpoint, raw, headers, exchange)
        return await self._answer(spec, upstream, timer, exchange, hidden_usage)

    async def responses(self, request: Request) -> Response | ASGIApp:
        """``POST /v1/responses``: the backend's own, else translated to chat."""
        exchange = exchange_of(request.scope)
        spec, payload, raw, _hidden = await self._prepare(request, "/v1/responses", exchange)
        self._refuse_if_down(spec)
        headers = self._headers(request, exchange)
        upstream, timer = await self._open(spec, "/v1/responses", raw, headers, exchange)
        if upstream.status_code not in RESPONSES_FALLBACK_STATUSES:
            return await self._answer(spec, upstream, timer, exchange)
        timer.cancel()
        await upstream.aclose()
        chat = responses_to_chat(payload)
        apply_defaults(chat, spec.entry, "/v1/chat/completions", self.sampling_defaults(spec))
        upstream, timer = await self._open(
            spec, "/v1/chat/completions", json.dumps(chat).encode(), headers, exchange
        )
        if upstream.status_code != 200:
            timer.cancel()
            exchange.stream = False
            return await self._answer(spec, upstream, timer, exchange)
        if not exchange.stream:
            content = await self._read(spec, upstream, exchange)
            try:
                completion = json.loads(content)
            except ValueError:
                completion = None
            if not isinstance(completion, dict):
                return Response(
                    backend_error_body(502, content), 502, media_type="application/json"
                )
            result = chat_to_response(completion, payload)
            exchange.note_response(result)
            return JSONResponse(result)
        translator = ResponseStreamTranslator(payload)
        events = self._watched(spec, self.upstream.iter_sse(spec, upstream), timer, exchange)
        return StreamRelay(
            self._translated(events, translator, exchange),
            upstream.aclose,
            error_event=lambda error: b"".join(translator.error(error.message)),
        )

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
