"""Relaying a backend's stream to the client, chunk by chunk, as a pure-ASGI response.

Nothing is buffered: each chunk is sent the moment it arrives. The relay ends early
in three ways, and always closes the upstream response so the backend stops
generating: the client disconnects (nothing more is sent), the request's deadline
passes, or the router's drain period runs out. A failure after the first byte can no
longer change the status code; it becomes one in-band ``data: {"error": ...}`` event
and a clean end of the stream.

Given a :class:`~slm_server.router.answer.stream_splice.Splice` and served by the
router's own protocol (which offers a
:class:`~slm_server.router.call.fast_path.FastPath`), the relay lets the splice
write the backend's pieces straight to the client instead of iterating ``chunks``;
everything else (the head, the cuts, the in-band errors, the end) is the same.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING

from starlette.types import Message, Receive, Scope, Send

from slm_server.errors import BackendTimeout, BackendUnavailable, GatewayError
from slm_server.router.call.drain import Drain
from slm_server.router.call.exchange import exchange_of
from slm_server.router.call.fast_path import fast_path_of
from slm_server.router.call.keepalive import STREAM_HEADERS, KeepAlive, first_beating
from slm_server.router.call.waits import client_of, running_loop

if TYPE_CHECKING:
    from slm_server.router.answer.stream_splice import Splice

log = logging.getLogger("slm_server.router")

# Marks the deadline as the reason a stream was cut (its error is made when needed).
_DEADLINE = GatewayError("deadline")


class StreamRelay:
    """An ASGI response that forwards ``chunks`` and always runs ``close`` at the end.

    ``deadline`` is an event-loop time (``loop.time()``); ``on_cut`` hears
    about a stream the relay had to cut (deadline or shutdown) before it is reported.
    ``on_head`` is told when the head starts going out to the client, and again once it
    is out: until then the client (its connection's buffer full), not the backend,
    holds the answer up. ``resume``, given a splice, is how the stream goes on when the
    splice breaks (the request sent again: the rest, read piece by piece; or the error
    raised).
    """

    def __init__(
        self,
        chunks: AsyncIterator[bytes],
        close: Callable[[], Awaitable[None]],
        *,
        status_code: int = 200,
        media_type: str = "text/event-stream",
        headers: Mapping[str, str] | None = None,
        error_event: Callable[[GatewayError], bytes] | None = None,
        deadline: float = math.inf,
        drain: Drain | None = None,
        on_cut: Callable[[GatewayError], None] | None = None,
        splice: Splice | None = None,
        on_head: Callable[[bool], None] | None = None,
        keepalive: KeepAlive | None = None,
        resume: Callable[[GatewayError], AsyncIterator[bytes]] | None = None,
    ) -> None:
        self.chunks = chunks
        self.resume = resume
        self.keepalive = keepalive
        # The head went out already, with keep-alives, while the request waited: this
        # relay goes on with the body of that stream.
        self.started = False
        self.on_head = on_head
        self.splice = splice
        self.close = close
        self.status_code = status_code
        self.media_type = media_type
        self.headers = dict(headers or {})
        self.error_event = error_event or (lambda error: error.sse_event())
        self.deadline = deadline
        self.drain = drain
        self.on_cut = on_cut

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Plain asyncio, no task group: the request's watcher task for the client's
        # disconnect, a timer for the deadline and a callback for the drain, each of
        # which cancels this task with the reason noted in ``cut``.
        loop = running_loop()
        task = asyncio.current_task(loop)
        assert task is not None
        cut: list[GatewayError | None] = []  # None: the client left

        def stop(reason: GatewayError | None) -> None:
            if not cut:
                cut.append(reason)
                task.cancel()

        def shutting_down() -> None:
            stop(
                BackendUnavailable(
                    "The router is shutting down and its drain period ended before this "
                    "answer finished",
                    code="shutting_down",
                )
            )

        client = client_of(scope, receive)
        if not client.arm(lambda: stop(None)):
            # The client left already: the status is recorded, nothing is relayed.
            if not self.started:
                await send(self._start())
            await self.close()
            return
        timer = loop.call_at(self.deadline, stop, _DEADLINE) if self.deadline < math.inf else None
        if self.drain is not None:
            self.drain.subscribe(shutting_down)
        try:
            try:
                await self._relay(scope, send)
            finally:
                # Nothing cancels this task any more.
                client.disarm()
                if timer is not None:
                    timer.cancel()
                if self.drain is not None:
                    self.drain.unsubscribe(shutting_down)
        except asyncio.CancelledError:
            if not cut or task.uncancel() > 0:
                raise  # cancelled from outside (as well)
            error = cut[0]
            if error is None:
                return  # the client left: nothing more to send
            if error is _DEADLINE:
                error = BackendTimeout(
                    "The request reached its deadline while the answer was streaming",
                    code="deadline_exceeded",
                )
            if self.on_cut is not None:
                self.on_cut(error)
            # The backend and the admission slot go first: a client that reads nothing
            # (its buffer full) would hold this send, and them with it, for ever.
            await self.close()
            await send(
                {"type": "http.response.body", "body": self.error_event(error), "more_body": True}
            )
        finally:
            # ``close`` runs to its end: it never waits (closing the upstream response
            # and freeing the admission slot are immediate), and a second call is a no-op.
            await self.close()
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    def _start(self) -> Message:
        headers = [(b"content-type", self.media_type.encode())]
        headers += [(k.encode(), v.encode()) for k, v in STREAM_HEADERS.items()]
        headers += [(k.encode(), v.encode("latin-1")) for k, v in self.headers.items()]
        return {"type": "http.response.start", "status": self.status_code, "headers": headers}

    async def _relay(self, scope: Scope, send: Send) -> None:
        if not self.started:
            on_head = self.on_head
            if on_head is not None:
                on_head(False)
            await send(self._start())
            if on_head is not None:
                on_head(True)
        door = fast_path_of(scope)

        async def send_body(body: bytes) -> None:
            await send({"type": "http.response.body", "body": body, "more_body": True})

        try:
            chunks = self.chunks
            if self.splice is not None and door is not None and door.writable:
                try:
                    await self.splice.run(door, self.keepalive)
                    return
                except GatewayError as error:
                    if self.resume is None:
                        raise
                    # The rest, if the request is sent again; else ``error``, raised.
                    chunks = self.resume(error)
            if self.keepalive is not None:
                chunks = first_beating(chunks, send_body, self.keepalive)
            async for chunk in chunks:
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
            exchange_of(scope).error_type = "internal_error"
            failure = GatewayError("The router failed while relaying this stream; see its log")
            await send(
                {"type": "http.response.body", "body": self.error_event(failure), "more_body": True}
            )
