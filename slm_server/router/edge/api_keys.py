"""Optional API keys (``SLM_API_KEYS`` / ``SLM_API_KEYS_FILE``): when any is set, every
``/v1/*`` route needs ``Authorization: Bearer <key>``, and so does ``/metrics`` (it names
every model) unless ``SLM_METRICS_NEED_KEY=false``; ``/health`` stays open. Keys are
compared in constant time and never logged."""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from slm_server.errors import GatewayError, Unauthorized
from slm_server.router.edge.reject import reject


class Keys:
    """Which requests need a key and whether they came with a valid one."""

    def __init__(self, keys: tuple[str, ...], metrics_need_key: bool = True) -> None:
        self.keys = tuple(key.encode() for key in keys)
        self.metrics_need_key = metrics_need_key

    def guarded(self, path: str) -> bool:
        return path.startswith("/v1/") or (self.metrics_need_key and path == "/metrics")

    def allowed(self, header: bytes | None) -> bool:
        if header is None or header[:7].lower() != b"bearer ":
            return False
        presented = header[7:].strip()
        matched = False
        for key in self.keys:  # compare against every key: no early exit to time
            matched |= hmac.compare_digest(presented, key)
        return matched

    def refusal(self, scope: Scope) -> GatewayError | None:
        """401 when keys are set, the path is guarded and no valid key came; else None."""
        if not self.keys or not self.guarded(scope["path"]):
            return None
        header = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        if self.allowed(header):
            return None
        return Unauthorized(
            "Missing or invalid API key: send 'Authorization: Bearer <key>' with a key "
            "from SLM_API_KEYS or SLM_API_KEYS_FILE"
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
