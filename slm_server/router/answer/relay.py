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

# An opened backend response, its stall timer and its progress record.
Opened = tuple[UpstreamResponse, StallTimer, Progress | None]


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
        request the backend stranded (nothing of the answer reached the client — no
        head, or a stream before its answer began, or a whole answer being gathered —
        and the process it was sent to is gone) is sent once more when the backend is
        back."""
        sent_to = self.recovery.process(call.spec)

        async def again(error: GatewayError) -> Opened | None:
            if call.exchange.recovery == "retried" or not await self._again(call, error, sent_to):
                return None
            return await self._open(call, path, body)

        try:
            opened = await self._open(call, path, body)
        except GatewayError as error:
            retried = await again(error)
            if retried is None:
                raise
            opened = retried
        if not call.gathered:
            return await self.replies.reply(call, *opened, translation, again)
        try:
            return await self.replies.reply(call, *opened, translation)
        except GatewayError as error:
            retried = await again(error)
            if retried is None:
                raise
        return await self.replies.reply(call, *retried, translation)

    async def _open(self, call: Call, path: str, body: bytes) -> Opened:
        """The backend's response opened, its stall timer and the record of what it
        delivers (None when the deadline is not the backend's to answer for)."""
        progress = self.sender.progress(call)
        upstream, timer = await self.sender.open(call, path, body, progress)
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
