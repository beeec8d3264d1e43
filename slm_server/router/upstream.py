"""The one module that talks HTTP to backends.

One pooled ``httpx.AsyncClient`` per backend. Transport exceptions are translated here,
at this single boundary, into the gateway's error tree:

    httpx.ConnectError / ConnectTimeout / PoolTimeout  -> BackendUnavailable (503)
    httpx.TimeoutException (read/write)                -> BackendTimeout (504)
    httpx.RemoteProtocolError / other TransportError   -> BackendProtocolError (502)
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from slm_server.config import ModelSpec
from slm_server.errors import BackendProtocolError, BackendTimeout, BackendUnavailable

RETRY_AFTER_SECONDS = 5.0
# Hop-by-hop and framing headers are the transport's business, never forwarded.
_DROPPED_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "connection",
        "keep-alive",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "proxy-authorization",
        "proxy-connection",
        "authorization",
        "accept-encoding",
    }
)


def forward_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The client's headers worth passing upstream."""
    return {k: v for k, v in headers.items() if k.lower() not in _DROPPED_HEADERS}


def translate(exc: httpx.HTTPError, spec: ModelSpec) -> Exception:
    """The gateway error for a transport failure talking to ``spec``'s backend."""
    where = f"backend for '{spec.entry.id}' ({spec.entry.base_url})"
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout):
        return BackendUnavailable(
            f"The {where} is unreachable: it is not running or still starting",
            retry_after=RETRY_AFTER_SECONDS,
        )
    if isinstance(exc, httpx.TimeoutException):
        return BackendTimeout(f"The {where} did not answer within {spec.entry.default_timeout:g}s")
    return BackendProtocolError(f"The {where} broke the connection: {type(exc).__name__}")


@dataclass(frozen=True)
class Probe:
    """The outcome of one ``/health`` probe."""

    status: str
    detail: str | None = None
    http_status: int | None = None


class Upstream:
    """Pooled HTTP clients to every enabled backend."""

    def __init__(
        self,
        models: tuple[ModelSpec, ...],
        connect_timeout: float,
        probe_timeout: float,
        health_paths: Mapping[str, str] | None = None,
    ) -> None:
        self.probe_timeout = probe_timeout
        self.health_paths = dict(health_paths or {})
        self._clients: dict[str, httpx.AsyncClient] = {}
        for spec in models:
            timeout = httpx.Timeout(spec.entry.default_timeout, connect=connect_timeout)
            # Idle connections are dropped well before a backend's own keep-alive timeout
            # (llama-server and uvicorn: 5 s), so a request never lands on a connection
            # the backend is closing. A refused connect is retried once, before any byte.
            limits = httpx.Limits(
                max_connections=None, max_keepalive_connections=64, keepalive_expiry=2.0
            )
            transport = httpx.AsyncHTTPTransport(limits=limits, retries=1)
            self._clients[spec.role] = httpx.AsyncClient(
                base_url=spec.entry.base_url,
                timeout=timeout,
                transport=transport,
                trust_env=False,
            )

    async def aclose(self) -> None:
        await asyncio.gather(*(client.aclose() for client in self._clients.values()))

    async def open(
        self, spec: ModelSpec, path: str, body: bytes, headers: Mapping[str, str]
    ) -> httpx.Response:
        """POST ``body`` to the backend and return once its status and headers arrived;
        the caller reads (or relays) the body and must close the response."""
        client = self._clients[spec.role]
        request = client.build_request("POST", path, content=body, headers=dict(headers))
        try:
            try:
                return await client.send(request, stream=True)
            except httpx.RemoteProtocolError:
                # A kept-alive connection the backend closed just as we reused it: the
                # answer had not begun, so send once more on a fresh connection.
                return await client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise translate(exc, spec) from exc

    async def read(self, spec: ModelSpec, response: httpx.Response) -> bytes:
        """The whole body of an opened response; always closes it."""
        try:
            return await response.aread()
        except httpx.HTTPError as exc:
            raise translate(exc, spec) from exc
        finally:
            await response.aclose()

    async def iter_raw(self, spec: ModelSpec, response: httpx.Response) -> AsyncIterator[bytes]:
        """The body of an opened response, chunk by chunk as it arrives."""
        try:
            async for chunk in response.aiter_raw():
                yield chunk
        except httpx.HTTPError as exc:
            raise translate(exc, spec) from exc

    async def iter_sse(
        self, spec: ModelSpec, response: httpx.Response
    ) -> AsyncIterator[dict[str, Any]]:
        """The JSON objects of an opened SSE response's ``data:`` lines, until ``[DONE]``."""
        try:
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    return
                try:
                    event = json.loads(data)
                except ValueError:
                    raise BackendProtocolError(
                        f"The backend for '{spec.entry.id}' sent a stream line that is not JSON"
                    ) from None
                if isinstance(event, dict):
                    yield event
        except httpx.HTTPError as exc:
            raise translate(exc, spec) from exc

    async def probe(self, spec: ModelSpec) -> Probe:
        """``GET /health`` on the backend with a short timeout."""
        client = self._clients[spec.role]
        try:
            path = self.health_paths.get(spec.role, "/health")
            response = await client.get(path, timeout=self.probe_timeout)
        except httpx.ConnectError:
            return Probe("unreachable", "Connection refused - backend not running")
        except httpx.TimeoutException:
            return Probe("timeout", f"no answer to /health within {self.probe_timeout:g}s")
        except httpx.HTTPError as exc:
            return Probe("error", f"{type(exc).__name__}: {exc}")
        if response.status_code == 200:
            return Probe("healthy", http_status=200)
        detail = response.text[:200] if response.text else None
        return Probe("unhealthy", detail, http_status=response.status_code)


def json_headers(extra: Mapping[str, str] | None = None) -> dict[str, Any]:
    headers = {"content-type": "application/json"}
    if extra:
        headers.update(extra)
    return headers


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
