"""Optional API keys (``SLM_API_KEYS`` / ``SLM_API_KEYS_FILE``): when any is set, every
model route (``/v1/*``, Ollama's ``/api/*``, ``/upstream/*``, ``/infill``) needs
``Authorization: Bearer <key>`` or ``x-api-key: <key>`` (the Anthropic clients' header),
and so does ``/metrics`` (it names every model) unless ``SLM_METRICS_NEED_KEY=false``;
``/health`` and ``/`` stay open. Keys are compared in constant time and never logged."""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from slm_server.errors import GatewayError, Unauthorized
from slm_server.router.apis.table import INFILL, UPSTREAM
from slm_server.router.call.reject import reject

# The model routes: OpenAI's and Anthropic's (``/v1/``), Ollama's (``/api/``), a
# backend's own (``/upstream/``) and llama-server's infill.
GUARDED_PREFIXES = ("/v1/", "/api/", UPSTREAM.path, INFILL.path)


class Keys:
    """Which requests need a key and whether they came with a valid one."""

    def __init__(self, keys: tuple[str, ...], metrics_need_key: bool = True) -> None:
        self.keys = tuple(key.encode() for key in keys)
        self.metrics_need_key = metrics_need_key

    def guarded(self, path: str) -> bool:
        return path.startswith(GUARDED_PREFIXES) or (self.metrics_need_key and path == "/metrics")

    def allowed(self, header: bytes | None, api_key: bytes | None = None) -> bool:
        """Whether the ``Authorization`` header (a Bearer key) or, failing that, the
        ``x-api-key`` header carries a configured key."""
        presented = []
        if header is not None and header[:7].lower() == b"bearer ":
            presented.append(header[7:].strip())
        if api_key is not None:
            presented.append(api_key.strip())
        matched = False
        for candidate in presented:
            for key in self.keys:  # compare against every key: no early exit to time
                matched |= hmac.compare_digest(candidate, key)
        return matched

    def refusal(self, scope: Scope) -> GatewayError | None:
        """401 when keys are set, the path is guarded and no valid key came; else None."""
        if not self.keys or not self.guarded(scope["path"]):
            return None
        header = api_key = None
        for name, value in scope["headers"]:
            if name == b"authorization" and header is None:
                header = value
            elif name == b"x-api-key" and api_key is None:
                api_key = value
        if self.allowed(header, api_key):
            return None
        return Unauthorized(
            "Missing or invalid API key: send 'Authorization: Bearer <key>' or "
            "'x-api-key: <key>' with a key from SLM_API_KEYS or SLM_API_KEYS_FILE"
        )


class ApiKeys(Keys):
    """Pure-ASGI middleware refusing ``/v1/*`` requests without a valid key (401)."""

    def __init__(self, app: ASGIApp, keys: tuple[str, ...], metrics_need_key: bool = True) -> None:
        super().__init__(keys, metrics_need_key)
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        refusal = self.refusal(scope) if scope["type"] == "http" else None
        if refusal is None:
            await self.app(scope, receive, send)
            return
        await reject(scope, send, refusal)
