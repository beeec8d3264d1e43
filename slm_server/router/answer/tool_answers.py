"""One answer's tool calls settled for its client: a
:class:`~slm_server.router.toolcalls.guard.ToolGuard` bound to the request it guards, to
how a call is asked again, and to the request's record, where what was done is
written for the answer's headers, its span and the metrics."""

from __future__ import annotations

from typing import Any

from slm_server.router.call.exchange import Exchange
from slm_server.router.toolcalls.guard import Ask, ToolGuard
from slm_server.router.toolcalls.stream_guard import StreamGuard


class ToolAnswers:
    """The :class:`~.translation.Tools` of one request."""

    def __init__(
        self, guard: ToolGuard, chat: dict[str, Any], ask: Ask, exchange: Exchange
    ) -> None:
        self.guard = guard
        self.chat = chat
        self.ask = ask
        self.exchange = exchange

    async def whole(self, chat: dict[str, Any]) -> dict[str, Any]:
        settled = await self.guard.whole(chat, self.chat, self.ask)
        self._note()
        return settled

    def stream(self) -> StreamGuard:
        return self.guard.stream()

    async def ending(self, held: Any) -> list[dict[str, Any]]:
        assert isinstance(held, StreamGuard)
        chunks = await self.guard.settled_stream(held, self.chat, self.ask)
        self._note()
        return chunks

    def _note(self) -> None:
        verdict, exchange = self.guard.verdict, self.exchange
        exchange.tool_mode = self.guard.label
        exchange.tool_calls = verdict.calls
        exchange.tool_repairs = tuple(verdict.repairs)
        exchange.tool_retried = verdict.retried
        exchange.tool_failed = verdict.failed


__all__ = ["ToolAnswers"]
