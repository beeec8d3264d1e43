"""The router's front: the ``Host`` allow-list and the API keys, then a direct road for
the proxied model endpoints.

One pure-ASGI layer (inside :class:`~slm_server.router.observe.observer.RequestObserver`, so
refused requests are logged and carry their request id) does what took a middleware
each: it refuses a request whose ``Host`` is not allowed (421, :mod:`.hosts`) or that
lacks a valid key (401, :mod:`.api_keys`). A ``POST`` to a proxied path then goes straight
to its handler, past Starlette's exception middleware, router and route wrappers — for
those requests they only matched a path and turned the handler's
:class:`~slm_server.errors.GatewayError` into its response, which is done here the same
way. Everything else (other paths and methods, 404, 405) goes through the application
as before.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from slm_server.errors import GatewayError
from slm_server.router.call.exchange import exchange_of
from slm_server.router.call.reject import reject
from slm_server.router.edge.api_keys import Keys
from slm_server.router.edge.hosts import AllowedHosts

Handler = Callable[[Request], Awaitable[Response | ASGIApp]]
ErrorHandler = Callable[[Request, Exception], Awaitable[Response]]


class Front:
    """Pure-ASGI middleware; see the module docstring. ``direct`` maps a ``POST`` path
    to its handler; ``on_error`` answers a :class:`GatewayError` its handler raised
    before the response started."""

    def __init__(
        self,
        app: ASGIApp,
        hosts: AllowedHosts,
        keys: Keys,
        direct: Mapping[str, Handler],
        on_error: ErrorHandler,
    ) -> None:
        self.app = app
        self.hosts = hosts
        self.keys = keys
        self.direct = dict(direct)
        self.on_error = on_error

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self.hosts.refusal(scope) or self.keys.refusal(scope)
        if refusal is not None:
            await reject(scope, send, refusal)
            return
        handler = self.direct.get(scope["path"]) if scope["method"] == "POST" else None
        if handler is None:
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive, send)
        try:
            response = await handler(request)
            await response(scope, receive, send)
        except GatewayError as error:
            if exchange_of(scope).status is not None:
                # As Starlette does: an error after the head went out has no answer left.
                started = "Caught handled exception, but response already started."
                raise RuntimeError(started) from error
            answer = await self.on_error(request, error)
            await answer(scope, receive, send)


__all__ = ["Front", "Handler"]
