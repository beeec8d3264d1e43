"""What every API shape's endpoint sends and answers with (:class:`Relay`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from starlette.responses import Response
from starlette.types import ASGIApp

from slm_server.errors import BackendTimeout, GatewayError
from slm_server.registry.schema import ModelSpec
from slm_server.router.answer.reply import Replies
from slm_server.router.answer.translation import Translation
from slm_server.router.call.admitted_call import Call
from slm_server.router.upstream.client import UpstreamResponse
from slm_server.router.upstream.sender import Sender
from slm_server.router.watchdog.tripwire import Progress, StallTimer


class Stranded(Protocol):
    """Whether a request its backend stranded is sent again
    (:class:`~slm_server.router.dispatch.recovery.Recovery`)."""

    def process(self, spec: ModelSpec) -> int | None:
        """The process a request to ``spec`` is sent to now; None when unknown."""
        ...

    async def stranded(self, call: Call, error: GatewayError, sent_to: int | None) -> bool:
        """Whether to send ``call`` again after ``error``, once its backend is back;
        raises ``TimeoutError`` when its deadline passes first."""
        ...


@dataclass(frozen=True)
class Relay:
    """What every API shape's endpoint is built from: the one sender and the replies of
    the router, the sampling defaults the launcher published for a backend, the
    server it runs for an entry (None when no launcher has said), and what decides
    whether a stranded request is sent again."""

    sender: Sender
    replies: Replies
    sampling_defaults: Callable[[ModelSpec], dict[str, Any]]
    server_kind: Callable[[ModelSpec], str | None]
    recovery: Stranded

    async def relay(
        self, call: Call, path: str, body: bytes, translation: Translation | None = None
    ) -> Response | ASGIApp:
        """``body`` to the backend's ``path`` under the call's deadline; the answer
        converted by ``translation`` when the request came in another API's shape. A
        request the backend stranded (nothing of the answer came, and the process it
        was sent to is gone) is sent once more when the backend is back."""
        upstream, timer, progress = await self.open(call, path, body)
        # A backend that breaks the answer before it began, and is gone, strands the
        # request as it would before the head: it is sent again, once.
        sent_to = self.recovery.process(call.spec)
        if not call.gathered:

            async def reopen(
                error: GatewayError,
            ) -> tuple[UpstreamResponse, StallTimer, Progress | None] | None:
                if call.exchange.recovery == "retried" or not await self._again(
                    call, error, sent_to
                ):
                    return None
                progress = self.sender.progress(call)
                upstream, timer = await self.sender.open(call, path, body, progress)
                return upstream, timer, progress

            return await self.replies.reply(call, upstream, timer, progress, translation, reopen)
        try:
            return await self.replies.reply(call, upstream, timer, progress, translation)
        except GatewayError as error:
            if call.exchange.recovery == "retried" or not await self._again(call, error, sent_to):
                raise
        progress = self.sender.progress(call)
        upstream, timer = await self.sender.open(call, path, body, progress)
        return await self.replies.reply(call, upstream, timer, progress, translation)

    async def open(
        self, call: Call, path: str, body: bytes
    ) -> tuple[UpstreamResponse, StallTimer, Progress | None]:
        """The backend's response opened, its stall timer and the record of what it
        delivers (None when the deadline is not the backend's to answer for)."""
        sender = self.sender
        sent_to = self.recovery.process(call.spec)
        progress = sender.progress(call)
        try:
            upstream, timer = await sender.open(call, path, body, progress)
            return upstream, timer, progress
        except GatewayError as error:
            if not await self._again(call, error, sent_to):
                raise
        progress = sender.progress(call)
        upstream, timer = await sender.open(call, path, body, progress)
        return upstream, timer, progress

    async def _again(self, call: Call, error: GatewayError, sent_to: int | None) -> bool:
        started = time.perf_counter()
        exchange = call.exchange
        try:
            again = await self.recovery.stranded(call, error, sent_to)
        except TimeoutError:
            raise BackendTimeout(
                f"The backend for '{call.spec.entry.id}' lost this request "
                f"({error.message}) and was not back within the request's deadline of "
                f"{call.deadline.seconds:.3g}s",
                code="deadline_exceeded",
            ) from error
        if again:
            exchange.recovery = "retried"
            exchange.recovery_seconds = time.perf_counter() - started
            spec = call.spec
            self.sender.tripwire.events.emit(
                "request_retried",
                role=spec.role,
                model_id=spec.entry.id,
                port=spec.entry.port,
                request_id=exchange.request_id,
                reason=error.code,
                waited_seconds=round(exchange.recovery_seconds, 3),
            )
        return again


__all__ = ["Relay", "Stranded"]
