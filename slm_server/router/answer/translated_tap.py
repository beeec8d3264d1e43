"""A chat completions stream translated into another API's as it is spliced
(:mod:`.stream_splice`): the tap the splice hands each piece of the backend's body to
returns that API's events for it, so a translated stream is relayed from the upstream
connection's own callback, as a stream relayed as it came is, with no async generator
resumed and no ASGI message built per event.

It does what the piece-by-piece walk of
:meth:`~slm_server.router.answer.translation.ChatTranslation.stream` does over the same
events: the engine's prompt progress noted and kept from the client, every chunk noted
on the exchange, a backend's in-band error ending the stream with the API's own error,
the preset's cap ending the turn, and the stream's closing events once the backend's
stream ends. A translation whose tool calls are held until they are settled (which may
ask the backend again) is walked piece by piece instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from slm_server.errors import AnswerTooLarge, BackendProtocolError
from slm_server.router.call.exchange import Exchange
from slm_server.router.upstream.sse import DONE, SseSplitter, data_object, is_report


class Tap(Protocol):
    """What a spliced (or piece by piece tapped) stream's bytes go through: ``feed``
    gives the bytes to write for a piece, ``flush`` those that end the stream."""

    exchange: Exchange
    error: str | None

    def feed(self, chunk: bytes) -> bytes: ...

    def flush(self) -> bytes: ...

    def restart(self) -> None: ...

    @property
    def owed(self) -> AnswerTooLarge | None: ...


class Translator(Protocol):
    """The translation's events (:class:`~.translation.StreamTranslator`)."""

    def start(self) -> list[bytes]: ...

    def feed(self, chunk: dict[str, Any]) -> list[bytes]: ...

    def finish(self) -> list[bytes]: ...


class TranslatingTap:
    """Chat completions events in, another API's events out.

    ``failed`` gives the events that end the stream for a backend's in-band ``error``;
    ``shown`` is what a chunk becomes before it is translated (the preset's cap ending
    the turn)."""

    def __init__(
        self,
        exchange: Exchange,
        translator: Translator,
        failed: Callable[[Any], list[bytes]],
        shown: Callable[[dict[str, Any]], dict[str, Any]],
        max_event_bytes: int,
    ) -> None:
        self.exchange = exchange
        self.translator = translator
        self.failed = failed
        self.shown = shown
        self._splitter = SseSplitter(max_event_bytes)
        self._started = False
        self._ended = False  # [DONE] or an in-band error: nothing more is translated
        self.error: str | None = None

    def feed(self, chunk: bytes) -> bytes:
        if self._ended:
            return b""
        out: list[bytes] = []
        for event in self._splitter.feed(chunk):
            self._event(event, out)
            if self._ended:
                break
        return b"".join(out)

    def _event(self, event: bytes, out: list[bytes]) -> None:
        try:
            value = data_object(event)
        except BackendProtocolError as broken:
            raise BackendProtocolError(
                f"The backend for '{self._model()}': {broken.message}"
            ) from None
        if value is None:
            return
        if value is DONE:
            self._ended = True
            return
        exchange = self.exchange
        if is_report(exchange, value):
            return
        if not self._started:
            self._started = True
            out += self.translator.start()
        exchange.note_response(value)
        error = value.get("error")
        if error is not None:
            message = error.get("message") if isinstance(error, dict) else error
            self.error = str(message)
            self._ended = True
            out += self.failed(error)
            return
        out += self.translator.feed(self.shown(value))

    def _model(self) -> str:
        spec = self.exchange.spec
        return spec.entry.id if spec is not None else "?"

    def flush(self) -> bytes:
        """The stream's closing events (none after an in-band error): the backend's
        stream ended."""
        out: list[bytes] = []
        rest = self._splitter.flush()
        if rest and not self._ended:
            self._event(rest, out)
        if self.error is not None:
            return b"".join(out)
        if not self._started:
            self._started = True
            out += self.translator.start()
        self._ended = True
        out += self.translator.finish()
        return b"".join(out)

    def restart(self) -> None:
        """A new response goes on in place of a broken one (its answer had not begun):
        the broken one's last, partial event is dropped."""
        self._splitter = SseSplitter(self._splitter.max_event_bytes)
        self._ended = False

    @property
    def owed(self) -> AnswerTooLarge | None:
        return self._splitter.owed


__all__ = ["Tap", "TranslatingTap", "Translator"]
