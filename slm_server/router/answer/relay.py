"""What every API shape's endpoint sends and answers with (:class:`Relay`)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from starlette.responses import Response
from starlette.types import ASGIApp

from slm_server.contracts import engine_paths
from slm_server.errors import BackendTimeout, ClientDisconnected, GatewayError
from slm_server.registry.infill import InfillCache
from slm_server.registry.schema import ModelSpec
from slm_server.router.answer.reply import Replies
from slm_server.router.answer.tool_answers import ToolAnswers
from slm_server.router.answer.translation import ChatTranslation, Translation
from slm_server.router.call.admitted_call import Call, Deadline
from slm_server.router.toolcalls.guard import GUARD_HEADER, tool_guard
from slm_server.router.toolcalls.template_caps import TemplateCaps
from slm_server.router.upstream.client import UpstreamResponse
from slm_server.router.upstream.sender import Sender
from slm_server.router.watchdog.tripwire import Progress, StallTimer

# How long before the call's deadline a call asked again must end (at most).
RETRY_MARGIN_SECONDS = 2.0
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
    server it runs for an entry (None when no launcher has said), what decides
    whether a stranded request is sent again, what knows whether a template takes
    tools, and what keeps an on-demand model loaded as a client asks."""

    sender: Sender
    replies: Replies
    sampling_defaults: Callable[[ModelSpec], dict[str, Any]]
    server_kind: Callable[[ModelSpec], str | None]
    recovery: Stranded
    caps: TemplateCaps
    # Sets an on-demand model's idle TTL for its process (Ollama's ``keep_alive``, in
    # seconds; None: its entry's again); nothing for a model loaded for good.
    keep_alive: Callable[[ModelSpec, float | None], None]
    # Whether a model fills in the middle (its GGUF read once); shared with GET /v1/models.
    infill: InfillCache

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

    async def _tools(
        self, call: Call, chat: dict[str, Any], alias: str | None, reports: bool
    ) -> ToolAnswers | None:
        """What settles the tool calls of the answer to ``chat`` (a chat request that
        offers tools, named by ``alias`` or its id; ``reports``: its engine reports its
        prompt progress); None when nothing does (no tools, the policy, the request's
        ``X-SLM-Tool-Guard: off``)."""
        if not chat.get("tools"):
            return None
        spec = call.spec
        off = call.headers.get(GUARD_HEADER.decode(), "").strip().lower() == "off"
        policy = spec.entry.tool_policy(alias)
        kind = self.server_kind(spec)
        takes = None
        if policy.mode == "auto" and not off:
            takes = await self.caps.takes_tools(spec, kind)
        guard = tool_guard(chat, policy, template_takes_tools=takes, server_kind=kind, off=off)
        if guard is None:
            return None

        async def ask(body: dict[str, Any]) -> dict[str, Any] | None:
            return await self.ask(call, body, reports)

        return ToolAnswers(guard, chat, ask, call.exchange)

    async def guarded(
        self,
        call: Call,
        chat: dict[str, Any],
        alias: str | None,
        reports: bool,
        translation: ChatTranslation[Any],
    ) -> dict[str, Any] | None:
        """``chat`` as its backend is sent it, its answer's tool calls to be settled by
        ``translation`` (:meth:`_tools`); None when nothing settles them."""
        tools = await self._tools(call, chat, alias, reports)
        if tools is None:
            return None
        translation.guarded(tools)
        return tools.guard.request(chat)

    async def ask(self, call: Call, chat: dict[str, Any], reports: bool) -> dict[str, Any] | None:
        """``chat`` sent to the call's backend as a stream and gathered whole (a call
        asked again: its stall timer any stream's, its deadline a little before the
        call's and never judged); None when no answer could be had."""
        remaining = call.deadline.remaining()
        margin = min(RETRY_MARGIN_SECONDS, max(0.25, remaining * 0.1))
        if remaining - margin <= 0:
            return None  # no time left to ask: the first answer stands
        # Ends before the call's own deadline, so that the first answer can still be
        # given, and that deadline never cuts the call while its backend is asked again.
        deadline = Deadline(remaining - margin, asyncio.get_running_loop().time)
        again = replace(
            call,
            deadline=deadline,
            judged=False,
            gathered=True,
            watch_progress=reports,
            keepalive=None,
        )
        body = {**chat, "stream": True, "stream_options": {"include_usage": True}}
        if reports:
            body["return_progress"] = True
        sent = json.dumps(body, ensure_ascii=False).encode()
        try:
            upstream, timer = await self.sender.open(again, engine_paths.CHAT, sent, None)
        except ClientDisconnected:
            raise
        except GatewayError:
            return None
        try:
            content_type = upstream.headers.get("content-type", "")
            if upstream.status_code != 200 or "event-stream" not in content_type:
                return None
            noted = timer.watch if timer.watch is not None else Progress(time.perf_counter())
            gathering = await self.replies.gather(again, upstream, timer, noted, None)
        except ClientDisconnected:
            raise  # the client left: nothing more is written to it
        except GatewayError:
            return None
        finally:
            timer.cancel()
            await upstream.aclose()
        return gathering.answer() if gathering.error is None else None

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
