"""How an answer in chat completions' shape is turned into another API's: the
:class:`Translation` a handler gives :meth:`~slm_server.router.answer.reply.Replies.reply`,
and :class:`ChatTranslation`, the walk over a stream that each API shape's own
(:class:`~slm_server.router.apis.responses.endpoint.ResponsesTranslation`,
:class:`~slm_server.router.apis.messages.endpoint.MessagesTranslation`) fills in.

An answer cut by the model's preset cap (``max_output_tokens`` in the registry), when the
client's own bound was larger, is translated as a finished turn (:func:`cap_ends_turn`):
the client did not ask for the cut, and the agents that speak these APIs take a cut as
an error to retry with a larger bound (Claude Code asks again with ``max_tokens``
128000, then gives up) or as a failed run (Codex CLI on ``incomplete``), so that the same
cap would only end them again."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from slm_server.errors import GatewayError
from slm_server.router.answer.translated_tap import Tap, TranslatingTap
from slm_server.router.call.exchange import Exchange
from slm_server.router.upstream.sse import is_report


class Translation(Protocol):
    """One request's answer translated from chat completions."""

    @property
    def api(self) -> str:
        """The API's name, as errors name it: "the Responses API"."""
        ...

    @property
    def media_type(self) -> str:
        """The content type of the translated stream."""
        ...

    async def whole(self, chat: dict[str, Any]) -> dict[str, Any]:
        """The answer for a whole chat completion."""
        ...

    def error_body(self, status: int, content: bytes) -> bytes:
        """The error answer for a backend's error (or unreadable) answer ``content``."""
        ...

    def stream(
        self, chunks: AsyncIterator[dict[str, Any]], exchange: Exchange
    ) -> AsyncIterator[bytes]:
        """The translated stream of the parsed chat chunks."""
        ...

    def stream_error(self, error: GatewayError) -> bytes:
        """The in-band end of a stream cut by ``error``."""
        ...

    def tap(self, exchange: Exchange, max_event_bytes: int) -> Tap | None:
        """What translates the stream as it is spliced (:mod:`.translated_tap`); None
        when it is walked piece by piece (:meth:`stream`)."""
        ...


def cap_ends_turn(chat: dict[str, Any]) -> dict[str, Any]:
    """Chat answer or chunk ``chat`` with each choice's ``length`` finish made ``stop``
    (``chat`` itself when it has none): the answer was cut by the preset's cap, not the
    client's bound."""
    choices = chat.get("choices")
    if not isinstance(choices, list) or not any(
        isinstance(c, dict) and c.get("finish_reason") == "length" for c in choices
    ):
        return chat
    ended = [
        {**c, "finish_reason": "stop"}
        if isinstance(c, dict) and c.get("finish_reason") == "length"
        else c
        for c in choices
    ]
    return {**chat, "choices": ended}


class HeldStream(Protocol):
    """A stream's tool calls held until they are settled
    (:class:`~slm_server.router.toolcalls.stream_guard.StreamGuard`)."""

    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        """The chunks to send now for one of the backend's."""
        ...

    def unsettled(self) -> list[dict[str, Any]]:
        """What was held, as text, for a stream that ends in an error."""
        ...


class Tools(Protocol):
    """What settles an answer's tool calls (:class:`~.tool_answers.ToolAnswers`)."""

    async def whole(self, chat: dict[str, Any]) -> dict[str, Any]:
        """A whole chat answer with its calls settled."""
        ...

    def stream(self) -> HeldStream:
        """What holds a stream's calls."""
        ...

    async def ending(self, held: Any) -> list[dict[str, Any]]:
        """The chunks that end a held stream, its calls settled."""
        ...


class StreamTranslator(Protocol):
    """A pure translator of one chat completions stream into another API's events."""

    def start(self) -> list[bytes]:
        """The events that open the stream."""
        ...

    def feed(self, chunk: dict[str, Any]) -> list[bytes]:
        """The events of one chat chunk."""
        ...

    def finish(self) -> list[bytes]:
        """The events that close the stream."""
        ...


S = TypeVar("S", bound=StreamTranslator)


class ChatTranslation(ABC, Generic[S]):
    """A :class:`Translation` for one request, from chat completions: each API shape
    gives its whole answer (:meth:`answer`), its stream translator and what a backend's
    in-band error becomes (:meth:`failed`); the walk over the stream is this one.
    ``capped``: the preset's cap, not the client's bound, limits the output (a cut there
    is a finished turn, :func:`cap_ends_turn`)."""

    api: ClassVar[str]  # named in errors: "the Responses API"
    media_type: ClassVar[str] = "text/event-stream"  # its stream's
    # Whether its stream may be translated as it is spliced (:meth:`tap`).
    splices: ClassVar[bool] = False

    def __init__(self, request: dict[str, Any], translator: S, *, capped: bool) -> None:
        self.request = request
        self.translator = translator
        self.capped = capped
        self.tools: Tools | None = None

    def guarded(self, tools: Tools) -> None:
        """The answer's tool calls settled by ``tools`` before they are translated."""
        self.tools = tools

    @abstractmethod
    def answer(self, chat: dict[str, Any]) -> dict[str, Any]:
        """The API's whole answer for the whole chat completion ``chat``."""

    @abstractmethod
    def failed(self, error: Any) -> list[bytes]:
        """The events that end the stream when the backend sent ``error`` in band."""

    def tap(self, exchange: Exchange, max_event_bytes: int) -> Tap | None:
        """The stream translated as it is spliced, unless its tool calls are held."""
        if not self.splices or self.tools is not None:
            return None
        return TranslatingTap(exchange, self.translator, self.failed, self._shown, max_event_bytes)

    def _shown(self, chunk: dict[str, Any]) -> dict[str, Any]:
        return cap_ends_turn(chunk) if self.capped else chunk

    async def whole(self, chat: dict[str, Any]) -> dict[str, Any]:
        if self.tools is not None:
            chat = await self.tools.whole(chat)
        return self.answer(cap_ends_turn(chat) if self.capped else chat)

    async def stream(
        self, chunks: AsyncIterator[dict[str, Any]], exchange: Exchange
    ) -> AsyncIterator[bytes]:
        """The parsed chat chunks as the API's events; a backend's in-band error ends
        them. The engine's prompt progress reports are dropped (the router asked for
        them, as signs of life)."""
        translator, tools = self.translator, self.tools
        held = tools.stream() if tools is not None else None
        for event in translator.start():
            yield event
        async for chunk in chunks:
            if is_report(exchange, chunk):  # the engine's prompt progress: the router's
                continue
            exchange.note_response(chunk)
            error = chunk.get("error")
            if error is not None:
                exchange.error_type = "backend_stream_error"
                for shown in held.unsettled() if held is not None else ():
                    for event in translator.feed(shown):
                        yield event
                for event in self.failed(error):
                    yield event
                return
            for shown in held.feed(chunk) if held is not None else (chunk,):
                for event in translator.feed(cap_ends_turn(shown) if self.capped else shown):
                    yield event
        if held is not None and tools is not None:
            for shown in await tools.ending(held):
                for event in translator.feed(cap_ends_turn(shown) if self.capped else shown):
                    yield event
        for event in translator.finish():
            yield event


class WholeOnly:
    """What a translation of answers that never stream (a token count, embeddings) has
    of a stream: nothing to walk or splice."""

    media_type: ClassVar[str] = "application/json"

    def tap(self, exchange: Exchange, max_event_bytes: int) -> None:  # never a stream
        return None

    async def stream(
        self, chunks: AsyncIterator[dict[str, Any]], exchange: Exchange
    ) -> AsyncIterator[bytes]:  # never a stream
        async for _chunk in chunks:
            pass
        yield b""


def backend_message(status: int, content: bytes) -> str:
    """The message of a backend's error answer of any shape (an OpenAI error object, an
    ``{"error": "..."}``, or text), kept as the backend wrote it."""
    message = ""
    try:
        parsed = json.loads(content)
    except (ValueError, RecursionError, UnicodeDecodeError):
        parsed = None
    if isinstance(parsed, dict):
        error = parsed.get("error")
        found = error.get("message") if isinstance(error, dict) else error
        if isinstance(found, str):
            message = found
    if not message:
        message = content.decode("utf-8", "replace").strip()[:2000]
    return message or f"the backend answered {status}"


def error_message(error: Any) -> str:
    """The message of a stream's ``error`` chunk (an object or anything else)."""
    message = error.get("message") if isinstance(error, dict) else error
    return message if isinstance(message, str) else json.dumps(error)


__all__ = [
    "ChatTranslation",
    "HeldStream",
    "StreamTranslator",
    "Tools",
    "Translation",
    "WholeOnly",
    "backend_message",
    "cap_ends_turn",
    "error_message",
]
