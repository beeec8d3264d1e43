"""The router's HTTP endpoints: proxying by model id, listings and health."""

from __future__ import annotations

import asyncio
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
from slm_server.router.relay import StreamRelay
from slm_server.router.requests import apply_defaults, is_stream, model_field, parse_body
from slm_server.router.responses import (
    ResponseStreamTranslator,
    chat_to_response,
    responses_to_chat,
)
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

_T = TypeVar("_T")

RESPONSES_FALLBACK_STATUSES = frozenset({404, 422})


def _backend_error_body(status: int, content: bytes) -> bytes:
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


class Gateway:
    """Request handlers bound to one registry, one set of upstream clients, and the
    router's half of the watchdog."""

    def __init__(
        self,
        settings: Settings,
        registry: Registry,
        upstream: Upstream,
        python_llama: bool,
        tripwire: Tripwire,
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.upstream = upstream
        self.python_llama = python_llama
        self.tripwire = tripwire
        self.states = StateView(settings.state_path)
        self.started = int(time.time())

    def sampling_defaults(self, spec: ModelSpec) -> dict[str, Any]:
        if spec.entry.backend == "llamacpp" and self.python_llama:
            return python_request_defaults(spec.entry)
        return {}

    async def _prepare(
        self, request: Request, endpoint: str
    ) -> tuple[ModelSpec, dict[str, Any], bytes]:
        raw = await request.body()
        payload = parse_body(raw)
        spec = self.registry.route(model_field(payload), endpoint)
        if apply_defaults(payload, spec.entry, endpoint, self.sampling_defaults(spec)):
            raw = json.dumps(payload).encode()
        return spec, payload, raw

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

    async def _open(
        self, spec: ModelSpec, path: str, body: bytes, headers: dict[str, str], stream: bool
    ) -> tuple[httpx.Response, StallTimer]:
        """Send the request; streams get a first-byte stall timer armed before sending."""
        timer = self.tripwire.stall_timer(spec) if stream else StallTimer(None)
        try:
            return await self.upstream.open(spec, path, body, headers), timer
        except GatewayError as error:
            timer.cancel()
            self.tripwire.observe(spec, outcome_of(error), error.message)
            raise
        except BaseException:
            timer.cancel()
            raise

    async def _read(self, spec: ModelSpec, upstream: httpx.Response) -> bytes:
        """The whole body, with the outcome judged by the watchdog."""
        try:
            content = await self.upstream.read(spec, upstream)
        except GatewayError as error:
            self.tripwire.observe(spec, outcome_of(error), error.message)
            raise
        self.tripwire.observe(spec, classify_status(upstream.status_code))
        return content

    async def _watched(
        self, spec: ModelSpec, chunks: AsyncIterator[_T], timer: StallTimer
    ) -> AsyncIterator[_T]:
        """``chunks`` as they come; the first one clears the stall timer and counts as
        health, a transport failure counts against the backend."""
        first = True
        try:
            async for chunk in chunks:
                if first:
                    first = False
                    timer.first_byte()
                    self.tripwire.observe(spec, HEALTHY)
                yield chunk
        except GatewayError as error:
            self.tripwire.observe(spec, outcome_of(error), error.message)
            raise
        finally:
            timer.cancel()

    async def _pass_through(
        self, spec: ModelSpec, upstream: httpx.Response, timer: StallTimer, stream: bool
    ) -> Response | ASGIApp:
        """Answer with the backend's response: relayed if it streams, else whole."""
        content_type = upstream.headers.get("content-type", "application/json")
        if stream and upstream.status_code == 200 and "event-stream" in content_type:
            return StreamRelay(
                self._watched(spec, self.upstream.iter_raw(spec, upstream), timer),
                upstream.aclose,
                media_type=content_type,
            )
        timer.cancel()
        content = await self._read(spec, upstream)
        if upstream.status_code >= 400:
            content = _backend_error_body(upstream.status_code, content)
            content_type = "application/json"
        return Response(content, status_code=upstream.status_code, media_type=content_type)

    async def proxy(self, request: Request) -> Response | ASGIApp:
        """``POST`` chat completions, completions, embeddings and rerank."""
        endpoint = request.url.path
        spec, payload, raw = await self._prepare(request, endpoint)
        self._refuse_if_down(spec)
        headers = forward_headers(request.headers)
        stream = is_stream(payload)
        upstream, timer = await self._open(spec, endpoint, raw, headers, stream)
        return await self._pass_through(spec, upstream, timer, stream)

    async def responses(self, request: Request) -> Response | ASGIApp:
        """``POST /v1/responses``: the backend's own, else translated to chat."""
        spec, payload, raw = await self._prepare(request, "/v1/responses")
        self._refuse_if_down(spec)
        headers = forward_headers(request.headers)
        stream = is_stream(payload)
        upstream, timer = await self._open(spec, "/v1/responses", raw, headers, stream)
        if upstream.status_code not in RESPONSES_FALLBACK_STATUSES:
            return await self._pass_through(spec, upstream, timer, stream)
        timer.cancel()
        await upstream.aclose()
        chat = responses_to_chat(payload)
        apply_defaults(chat, spec.entry, "/v1/chat/completions", self.sampling_defaults(spec))
        upstream, timer = await self._open(
            spec, "/v1/chat/completions", json.dumps(chat).encode(), headers, stream
        )
        if upstream.status_code != 200:
            return await self._pass_through(spec, upstream, timer, stream=False)
        if not stream:
            content = await self._read(spec, upstream)
            try:
                completion = json.loads(content)
            except ValueError:
                completion = None
            if not isinstance(completion, dict):
                return Response(
                    _backend_error_body(502, content), 502, media_type="application/json"
                )
            return JSONResponse(chat_to_response(completion, payload))
        translator = ResponseStreamTranslator(payload)
        events = self._watched(spec, self.upstream.iter_sse(spec, upstream), timer)
        return StreamRelay(
            self._translated(events, translator),
            upstream.aclose,
            error_event=lambda error: b"".join(translator.error(error.message)),
        )

    async def _translated(
        self, chunks: AsyncIterator[dict[str, Any]], translator: ResponseStreamTranslator
    ) -> AsyncIterator[bytes]:
        for event in translator.start():
            yield event
        async for chunk in chunks:
            error = chunk.get("error")
            if error is not None:
                message = error.get("message") if isinstance(error, dict) else str(error)
                for event in translator.error(str(message)):
                    yield event
                return
            for event in translator.feed(chunk):
                yield event
        for event in translator.finish():
            yield event

    async def models(self, _request: Request) -> JSONResponse:
        """``GET /v1/models``: the enabled models and their settings."""
        data = [
            {
                "id": spec.entry.id,
                "object": "model",
                "created": self.started,
                "owned_by": "slm_server",
                "role": spec.role,
                "backend": spec.entry.backend,
                "port": spec.entry.port,
                "model_type": spec.entry.model_type,
                "context_length": spec.entry.context_length,
                "quantization": spec.entry.quantization,
                "supports_function_calling": spec.entry.supports_function_calling,
            }
            for spec in self.registry.enabled
        ]
        return JSONResponse({"object": "list", "data": data})

    async def backends_health(self, _request: Request) -> JSONResponse:
        """``GET /v1/backends/health``: every backend probed at once, keyed by role."""
        probes = await asyncio.gather(*(self.upstream.probe(s) for s in self.registry.enabled))
        by_role = dict(zip((s.role for s in self.registry.enabled), probes, strict=True))
        launcher_alive = self.states.launcher_alive()
        report: dict[str, dict[str, Any]] = {}
        now = time.time()
        for spec in self.registry.models:
            entry = spec.entry
            item: dict[str, Any] = {
                "model_id": entry.id,
                "backend": entry.backend,
                "port": entry.port,
                "model_type": entry.model_type,
            }
            probe = by_role.get(spec.role)
            if not entry.enabled or probe is None:
                item["status"] = "disabled"
                item["state"] = "disabled"
            else:
                item["status"] = probe.status
                if probe.detail is not None:
                    item["error"] = probe.detail
                if probe.http_status is not None and probe.status != "healthy":
                    item["http_status"] = probe.http_status
                known = self.states.get(spec.role, entry.port)
                streak = self.tripwire.open_streak(spec.role)
                if known is not None:
                    state = known.state if launcher_alive else "unsupervised"
                    if state == "ready" and streak:
                        state = "degraded"
                    item.update(
                        state=state,
                        pid=known.pid,
                        uptime_seconds=round(now - known.started_at, 1)
                        if known.started_at
                        else None,
                        restarts=known.restarts,
                        last_exit=known.last_exit,
                        last_restart_reason=known.last_restart_reason,
                        reason=known.reason,
                    )
                item["failure_streak"] = streak
            report[spec.role] = item
        return JSONResponse(report)

    async def health(self, _request: Request) -> JSONResponse:
        """``GET /health``: the router itself."""
        return JSONResponse({"status": "ok", "models": len(self.registry.enabled)})


def error_response(error: GatewayError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers())
