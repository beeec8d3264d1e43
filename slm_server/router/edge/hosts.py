"""The ``Host`` allow-list, against DNS rebinding: a page on ``evil.example`` whose name
is made to resolve to 127.0.0.1 can reach the router from the user's browser, but its
requests still say ``Host: evil.example``. Allowed: any IP address (a page cannot
rebind an address), ``localhost`` and ``*.localhost``, the router's configured host,
and the names in ``SLM_ALLOWED_HOSTS`` (``*`` there turns the check off). A request
without ``Host`` (HTTP/1.0) passes; one with two is a 400. Others get 421 before
anything else is read. (An absolute-form target's authority replaces ``Host`` at the
door, :mod:`slm_server.router.edge.http_protocol`.)"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

from slm_server.errors import GatewayError, InvalidRequest, MisdirectedRequest
from slm_server.router.call.reject import reject

MAX_SHOWN = 100
SEEN_MAX = 64


def host_name(header: str) -> str:
    """The name (or address) in a ``Host`` value: port, brackets, trailing dot and
    case removed."""
    host = header.strip().lower()
    if host.startswith("["):
        end = host.find("]")
        return host[1:end] if end > 0 else host
    if host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".")


class AllowedHosts:
    """Which ``Host`` values may pass: the judgement, with no ASGI in it."""

    def __init__(self, names: Iterable[str]) -> None:
        listed = {host_name(name) for name in names if name.strip()}
        self.allow_all = "*" in listed
        self.names = frozenset(listed - {"*"})
        self._seen: dict[str, bool] = {}  # Host value -> allowed, for the usual few

    def allowed(self, header: str | None) -> bool:
        if self.allow_all or header is None:
            return True
        known = self._seen.get(header)
        if known is None:
            known = self._judge(header)
            if len(self._seen) >= SEEN_MAX:
                self._seen.clear()  # bounded, whatever Host values clients invent
            self._seen[header] = known
        return known

    def _judge(self, header: str) -> bool:
        name = host_name(header)
        try:
            ipaddress.ip_address(name)
        except ValueError:
            return name == "localhost" or name.endswith(".localhost") or name in self.names
        return True

    def refusal(self, scope: Scope) -> GatewayError | None:
        """Why the request may not pass (two ``Host`` headers, or one not allowed), or
        None when it may."""
        hosts = [v for k, v in scope["headers"] if k == b"host"]
        if len(hosts) > 1:  # RFC 9112 3.2: which one would the backend believe?
            return InvalidRequest(
                "The request has more than one Host header", code="duplicate_host"
            )
        header = hosts[0].decode("latin-1") if hosts else None
        if self.allowed(header):
            return None
        shown = (header or "")[:MAX_SHOWN].encode("unicode_escape").decode("ascii")
        return MisdirectedRequest(
            f"The Host '{shown}' is not one this router serves: use 127.0.0.1 or "
            "localhost, or list the name in SLM_ALLOWED_HOSTS"
        )


class HostCheck(AllowedHosts):
    """Pure-ASGI middleware: 421 ``host_not_allowed`` for a ``Host`` not allowed."""

    def __init__(self, app: ASGIApp, names: Iterable[str]) -> None:
        super().__init__(names)
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self.refusal(scope)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        await reject(scope, send, refusal)
