"""Relaying a backend's stream to the client, chunk by chunk, as a pure-ASGI response.

Nothing is buffered: each chunk is sent the moment it arrives. A client disconnect
cancels the relay and closes the upstream response, so the backend sees its connection
close and stops generating. A failure after the first byte can no longer change the
status code; it becomes one in-band ``data: {"error": ...}`` event and a clean end.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
from starlette.types import Message, Receive, Scope, Send

from slm_server.errors import GatewayError

STREAM_HEADERS = {
    "cache-control": "no-cache",
    "x-accel-buffering": "no",
}


class StreamRelay:
    """An ASGI response that forwards ``chunks`` and always runs ``close`` at the end."""

    def __init__(
        self,
        chunks: AsyncIterator[bytes],
        close: Callable[[], Awaitable[None]],
        *,
        status_code: int = 200,
        media_type: str = "text/event-stream",
        error_event: Callable[[GatewayError], bytes] | None = None,
    ) -> None:
        self.chunks = chunks
        self.close = close
        self.status_code = status_code
        self.media_type = media_type
        self.error_event = error_event or (lambda error: error.sse_event())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with anyio.create_task_group() as group:

            async def watch_disconnect() -> None:
                while True:
                    message: Message = await receive()
                    if message["type"] == "http.disconnect":
                        group.cancel_scope.cancel()
                        return

            group.start_soon(watch_disconnect)
            try:
                await self._relay(send)
            finally:
                with anyio.CancelScope(shield=True):
                    await self.close()
                group.cancel_scope.cancel()

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
        await send({"type": "http.response.body", "body": b"", "more_body": False})
