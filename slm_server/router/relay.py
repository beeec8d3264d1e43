"""Relaying a backend's stream to the client, chunk by chunk, as a pure-ASGI response.

Nothing is buffered: each chunk is sent the moment it arrives. The relay ends early
in three ways, and always closes the upstream response so the backend stops
generating: the client disconnects (nothing more is sent), the request's deadline
passes, or the router's drain period runs out. A failure after the first byte can no
longer change the status code; it becomes one in-band ``data: {"error": ...}`` event
and a clean end of the stream.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
from starlette.types import Message, Receive, Scope, Send

from slm_server.errors import BackendTimeout, BackendUnavailable, GatewayError
from slm_server.router.drain import Drain

log = logging.getLogger("slm_server.router")

STREAM_HEADERS = {
    "cache-control": "no-cache",
    "x-accel-buffering": "no",
}


class StreamRelay:
    """An ASGI response that forwards ``chunks`` and always runs ``close`` at the end.

    ``deadline`` is an event-loop time (``anyio.current_time()``); ``on_cut`` hears
    about a stream the relay had to cut (deadline or shutdown) before it is reported.
    """

    def __init__(
        self,
        chunks: AsyncIterator[bytes],
        close: Callable[[], Awaitable[None]],
        *,
        status_code: int = 200,
        media_type: str = "text/event-stream",
        error_event: Callable[[GatewayError], bytes] | None = None,
        deadline: float = math.inf,
        drain: Drain | None = None,
        on_cut: Callable[[GatewayError], None] | None = None,
    ) -> None:
        self.chunks = chunks
        self.close = close
        self.status_code = status_code
        self.media_type = media_type
        self.error_event = error_event or (lambda error: error.sse_event())
        self.deadline = deadline
        self.drain = drain
        self.on_cut = on_cut

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        cut: list[GatewayError] = []
        async with anyio.create_task_group() as group:

            async def watch_disconnect() -> None:
                while True:
                    message: Message = await receive()
                    if message["type"] == "http.disconnect":
                        group.cancel_scope.cancel()
                        return

            group.start_soon(watch_disconnect)
            try:
                with anyio.CancelScope(deadline=self.deadline) as relay_scope:
                    if self.drain is not None:
                        group.start_soon(self._watch_drain, relay_scope, cut)
                    await self._relay(send)
                if relay_scope.cancelled_caught:
                    error = (
                        cut[0]
                        if cut
                        else BackendTimeout(
                            "The request reached its deadline while the answer was streaming",
                            code="deadline_exceeded",
                        )
                    )
                    if self.on_cut is not None:
                        self.on_cut(error)
                    await send(
                        {
                            "type": "http.response.body",
                            "body": self.error_event(error),
                            "more_body": True,
                        }
                    )
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            finally:
                with anyio.CancelScope(shield=True):
                    await self.close()
                group.cancel_scope.cancel()

    async def _watch_drain(self, relay_scope: anyio.CancelScope, cut: list[GatewayError]) -> None:
        assert self.drain is not None
        await self.drain.expired.wait()
        cut.append(
            BackendUnavailable(
                "The router is shutting down and its drain period ended before this "
                "answer finished",
                code="shutting_down",
            )
        )
        relay_scope.cancel()

    async def _relay(self, send: Send) -> None:
        headers = [(b"content-type", self.media_type.encode())]
        headers += [(k.encode(), v.encode()) for k, v in STREAM_HEADERS.items()]
        await send({"type": "http.response.start", "status": self.status_code, "headers": headers})
        try:
            async for chunk in self.chunks:
                if chunk:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except GatewayError as error:
            await send(
                {"type": "http.response.body", "body": self.error_event(error), "more_body": True}
            )
        except Exception:
            # A bug of ours mid-stream: the status is sent, so report it in band and end
            # the stream cleanly rather than cutting the connection.
            log.exception("unexpected error while relaying a stream")
            failure = GatewayError("The router failed while relaying this stream; see its log")
            await send(
                {"type": "http.response.body", "body": self.error_event(failure), "more_body": True}
            )
