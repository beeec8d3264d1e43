"""The router's HTTP endpoints: proxying by model id, listings and health."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp

from slm_server.config import ModelSpec
from slm_server.errors import GatewayError
from slm_server.launch.llama_argv import python_request_defaults
from slm_server.launch.records import read_state
from slm_server.registry import Registry
from slm_server.router.relay import StreamRelay
from slm_server.router.requests import apply_defaults, is_stream, model_field, parse_body
from slm_server.router.responses import (
    ResponseStreamTranslator,
    chat_to_response,
    responses_to_chat,
)
from slm_server.router.upstream import Upstream, forward_headers
from slm_server.settings import Settings

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


class Gateway:
    """Request handlers bound to one registry and one set of upstream clients."""

    def __init__(
        self, settings: Settings, registry: Registry, upstream: Upstream, python_llama: bool
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.upstream = upstream
        self.python_llama = python_llama
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

    async def _pass_through(
        self, spec: ModelSpec, upstream: httpx.Response, stream: bool
    ) -> Response | ASGIApp:
        """Answer with the backend's response: relayed if it streams, else whole."""
        content_type = upstream.headers.get("content-type", "application/json")
        if stream and upstream.status_code == 200 and "event-stream" in content_type:
            return StreamRelay(
                self.upstream.iter_raw(spec, upstream),
                upstream.aclose,
                media_type=content_type,
            )
        content = await self.upstream.read(spec, upstream)
        if upstream.status_code >= 400:
            content = _backend_error_body(upstream.status_code, content)
            content_type = "application/json"
        return Response(content, status_code=upstream.status_code, media_type=content_type)

    async def proxy(self, request: Request) -> Response | ASGIApp:
        """``POST`` chat completions, completions, embeddings and rerank."""
        endpoint = request.url.path
        spec, payload, raw = await self._prepare(request, endpoint)
        headers = forward_headers(request.headers)
        upstream = await self.upstream.open(spec, endpoint, raw, headers)
        return await self._pass_through(spec, upstream, is_stream(payload))

    async def responses(self, request: Request) -> Response | ASGIApp:
        """``POST /v1/responses``: the backend's own, else translated to chat."""
        spec, payload, raw = await self._prepare(request, "/v1/responses")
        headers = forward_headers(request.headers)
        upstream = await self.upstream.open(spec, "/v1/responses", raw, headers)
        if upstream.status_code not in RESPONSES_FALLBACK_STATUSES:
            return await self._pass_through(spec, upstream, is_stream(payload))
        await upstream.aclose()
        chat = responses_to_chat(payload)
        apply_defaults(chat, spec.entry, "/v1/chat/completions", self.sampling_defaults(spec))
        upstream = await self.upstream.open(
            spec, "/v1/chat/completions", json.dumps(chat).encode(), headers
        )
        if upstream.status_code != 200:
            return await self._pass_through(spec, upstream, stream=False)
        if not is_stream(payload):
            content = await self.upstream.read(spec, upstream)
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
        return StreamRelay(
            self._translated(spec, upstream, translator),
            upstream.aclose,
            error_event=lambda error: b"".join(translator.error(error.message)),
        )

    async def _translated(
        self, spec: ModelSpec, upstream: httpx.Response, translator: ResponseStreamTranslator
    ) -> AsyncIterator[bytes]:
        for event in translator.start():
            yield event
        async for chunk in self.upstream.iter_sse(spec, upstream):
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
        _launcher, states = read_state(self.settings.state_path)
        launcher_state = {(s.role, s.port): s for s in states}
        report: dict[str, dict[str, Any]] = {}
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
            else:
                item["status"] = probe.status
                if probe.detail is not None:
                    item["error"] = probe.detail
                if probe.http_status is not None and probe.status != "healthy":
                    item["http_status"] = probe.http_status
                known = launcher_state.get((spec.role, entry.port))
                if known is not None:
                    item["state"] = known.state
                    item["pid"] = known.pid
                    if known.reason:
                        item["reason"] = known.reason
            report[spec.role] = item
        return JSONResponse(report)

    async def health(self, _request: Request) -> JSONResponse:
        """``GET /health``: the router itself."""
        return JSONResponse({"status": "ok", "models": len(self.registry.enabled)})


def error_response(error: GatewayError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers())
