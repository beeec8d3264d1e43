"""Answering the client from an opened backend response: a stream relayed chunk by
chunk (as it came, or translated to another API's events), anything else read whole
under the deadline and passed on — errors in the OpenAI shape, a translated request's
chat answer converted back (:mod:`.translation`: the Responses API's, the Messages
API's). The call's admission slot is freed when the answer is complete (for a stream:
when the relay ends, however it ends)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp

from slm_server.errors import BackendProtocolError, BackendUnavailable, GatewayError
from slm_server.router.answer.answer_fields import answer_fields
from slm_server.router.answer.gathered import ChatGathering
from slm_server.router.answer.stream_relay import StreamRelay
from slm_server.router.answer.stream_splice import Splice
from slm_server.router.answer.translated_tap import Tap
from slm_server.router.answer.translation import Translation
from slm_server.router.answer.whole_answer import WholeAnswer
from slm_server.router.call.admitted_call import Call
from slm_server.router.call.drain import Drain
from slm_server.router.call.exchange import ANSWERING
from slm_server.router.upstream.client import (
    UpstreamResponse,
    backend_error_body,
    content_encoding,
    iter_raw,
    iter_sse,
)
from slm_server.router.upstream.sender import Sender
from slm_server.router.upstream.sse import SseTap, is_report
from slm_server.router.watchdog.tripwire import Progress, StallTimer

JSON = "application/json"


@dataclass(slots=True)
class _Answer:
    """One answer under way: its call, the backend's response, the first-byte timer,
    what the backend delivered (``noted``; ``progress`` is None when the client shortened
    the deadline and it is never judged), and the hooks its relay calls."""

    sender: Sender
    call: Call
    upstream: UpstreamResponse
    timer: StallTimer
    progress: Progress | None
    noted: Progress

    def on_cut(self, error: GatewayError) -> None:
        self.call.exchange.note_error(error)
        if error.code == "deadline_exceeded":
            self.sender.judge_deadline(self.call.spec, self.progress, error)

    def on_head(self, sent: bool) -> None:
        # The head waits for the client (a full buffer): the backend's first-byte
        # timer and silence stop until it is out, and then start afresh.
        if sent:
            self.noted.go_on(time.perf_counter())
            self.timer.resume()
        else:
            self.timer.pause()
            self.noted.hold()

    async def swap(
        self, upstream: UpstreamResponse, timer: StallTimer, progress: Progress | None
    ) -> None:
        """The backend's response sent again (:data:`Reopen`) in the place of the one
        that broke, which is closed."""
        self.timer.cancel()
        await self.upstream.aclose()
        self.upstream, self.timer, self.progress = upstream, timer, progress
        noted = progress if progress is not None else timer.watch
        self.noted = noted if noted is not None else Progress(time.perf_counter())

    async def close(self) -> None:
        # A relay that never began reading (the client left first) must not leave
        # the first-byte timer to blame the backend.
        self.timer.cancel()
        try:
            await self.upstream.aclose()
        finally:
            self.call.slot.release()


# Sends a stream's request again after its backend broke it (the relay's, which knows
# the request and whether the backend stranded it): the new response, its stall timer
# and progress record; None when it is not to be sent again.
Reopen = Callable[
    [GatewayError], Awaitable[tuple[UpstreamResponse, StallTimer, Progress | None] | None]
]
_T = TypeVar("_T")


class Replies:
    """Turns backend responses into the client's answers, for one router."""

    def __init__(self, sender: Sender, drain: Drain, max_event: int) -> None:
        self.sender = sender
        self.drain = drain
        self.max_event = max_event

    async def reply(
        self,
        call: Call,
        upstream: UpstreamResponse,
        timer: StallTimer,
        progress: Progress | None,
        translation: Translation | None = None,
        reopen: Reopen | None = None,
    ) -> Response | ASGIApp:
        """Answer with an opened upstream response: relayed when it streams, else read
        whole under the deadline; converted by ``translation`` when the request came in
        another API's shape. A stream the backend breaks before the answer began goes
        on from the request sent again where ``reopen`` sends it. ``progress``
        notes what the backend delivers, for the watchdog to judge a deadline that cuts
        the answer; None when the client shortened the deadline (it is never judged)."""
        spec, exchange = call.spec, call.exchange
        content_type = upstream.headers.get("content-type", "application/json")
        streams = upstream.status_code == 200 and "event-stream" in content_type
        noted = progress if progress is not None else timer.watch
        if noted is None:
            noted = Progress(time.perf_counter())
        answer = _Answer(self.sender, call, upstream, timer, progress, noted)
        encoding = content_encoding(upstream)
        if encoding is not None and translation is not None:
            timer.cancel()
            await answer.close()
            raise BackendProtocolError(
                f"The backend for '{spec.entry.id}' sent a {encoding}-encoded answer, "
                f"which the router cannot translate to {translation.api}",
                code="upstream_encoded",
            )
        if exchange.stream and streams:
            return self._relay(answer, content_type, encoding, translation, reopen)
        if call.gathered and streams and encoding is None:
            return await self._gathered(answer, translation)
        timer.cancel()
        try:
            try:
                content = await self.sender.read(call, upstream, progress)
            finally:
                await upstream.aclose()
            # Under the slot: settling the answer's tool calls may ask the backend again.
            return await _whole(
                call, upstream.status_code, content_type, encoding, content, translation
            )
        finally:
            call.slot.release()

    async def _gathered(
        self, answer: _Answer, translation: Translation | None
    ) -> Response | ASGIApp:
        """The whole answer to a request that did not ask to stream, gathered from the
        stream the router asked for (:mod:`.gathered`), under the deadline, each chunk a
        sign of life; the engine's in-band error is its error answer. The admission slot
        is freed once the answer is whole."""
        call = answer.call
        exchange = call.exchange
        try:
            gathering = await self.gather(
                call, answer.upstream, answer.timer, answer.noted, answer.progress
            )
        finally:
            # The slot is kept when the gathering fails: the request may be sent again
            # (the relay's retry), and otherwise the orchestrator frees it.
            answer.timer.cancel()
            await answer.upstream.aclose()
        try:
            failed = gathering.error
            if failed is not None:
                exchange.error_type = "backend_stream_error"
                error = failed.get("error")
                code = error.get("code") if isinstance(error, dict) else None
                status = code if isinstance(code, int) and 400 <= code < 600 else 500
                return await _whole(call, status, JSON, None, _dumps(failed), translation)
            return await _whole(call, 200, JSON, None, _dumps(gathering.answer()), translation)
        finally:
            call.slot.release()

    async def gather(
        self,
        call: Call,
        upstream: UpstreamResponse,
        timer: StallTimer,
        noted: Progress,
        progress: Progress | None,
    ) -> ChatGathering:
        """A chat stream gathered whole under the call's deadline (judged from
        ``progress``), each chunk noted as a sign of life, the engine's progress reports
        left out (the caller closes ``upstream``)."""
        gathering = ChatGathering(self.sender.max_answer)
        events = iter_sse(call.spec, upstream, self.max_event)
        exchange = call.exchange

        async def gather() -> None:
            async for chunk in self.sender.watched(call, events, timer, noted):
                timer.first_byte()  # a request sent again: its exchange began already
                if not is_report(exchange, chunk):
                    gathering.feed(chunk)

        await self.sender.guard(call, gather(), progress)
        return gathering

    def _relay(
        self,
        answer: _Answer,
        content_type: str,
        encoding: str | None,
        translation: Translation | None,
        reopen: Reopen | None,
    ) -> StreamRelay:
        """A streamed answer relayed as it comes: translated event by event, passed
        as it came when it is encoded (the client decodes it), else tapped for what
        telemetry reports and, where the door allows, spliced to the client. Until the
        answer begins, a backend that breaks it is sent the request again (``reopen``)
        and the stream goes on from there."""
        call, upstream, timer, noted = answer.call, answer.upstream, answer.timer, answer.noted
        spec, exchange = call.spec, call.exchange
        max_event = self.max_event

        def relay(chunks: AsyncIterator[bytes], **fields: Any) -> StreamRelay:
            return StreamRelay(
                chunks,
                answer.close,
                deadline=call.deadline.at,
                drain=self.drain,
                on_cut=answer.on_cut,
                on_head=answer.on_head,
                keepalive=fields.pop("keepalive", call.keepalive),
                **fields,
            )

        def events(response: UpstreamResponse) -> AsyncIterator[dict[str, Any]]:
            return iter_sse(spec, response, max_event)

        def raw(response: UpstreamResponse) -> AsyncIterator[bytes]:
            return iter_raw(spec, response)

        tap: Tap
        translated: dict[str, Any] = {}
        if translation is not None:
            translating = translation.tap(exchange, max_event)
            if translating is None:
                parsed = self._resumable(answer, events(upstream), events, reopen)
                return relay(
                    translation.stream(parsed, exchange),
                    error_event=translation.stream_error,
                    media_type=translation.media_type,
                )
            # Translated as it is spliced, event by event: as a stream relayed as it came.
            tap, content_type = translating, translation.media_type
            translated["error_event"] = translation.stream_error
        elif encoding is not None:  # the bytes as they came: the client decodes them
            chunks = self.sender.watched(call, raw(upstream), timer, noted)
            # No keep-alive: it would be plain text inside the encoded body.
            headers = {"content-encoding": encoding}
            return relay(chunks, media_type=content_type, headers=headers, keepalive=None)
        else:
            tap = SseTap(
                exchange,
                drop_usage_chunk=call.hidden_usage,
                max_event_bytes=max_event,
                drop_progress=call.hidden_progress,
            )
        spliced = None
        source = upstream.spliceable()
        if source is not None:
            tripwire = self.sender.tripwire
            spliced = Splice(spec, exchange, source, tap, timer, noted, tripwire)

        def resume(error: GatewayError) -> AsyncIterator[bytes]:
            # The splice broke: the rest, read piece by piece, through the same tap.
            return _tapped(self._resumable(answer, None, raw, reopen, error, tap.restart), tap)

        return relay(
            _tapped(self._resumable(answer, raw(upstream), raw, reopen, None, tap.restart), tap),
            media_type=content_type,
            splice=spliced,
            resume=resume if reopen is not None else None,
            **translated,
        )

    async def _resumable(
        self,
        answer: _Answer,
        first: AsyncIterator[_T] | None,
        read: Callable[[UpstreamResponse], AsyncIterator[_T]],
        reopen: Reopen | None,
        broke: GatewayError | None = None,
        restart: Callable[[], None] | None = None,
    ) -> AsyncIterator[_T]:
        """The stream's chunks, read with ``read`` from ``first`` (None: it ``broke``
        already); when the backend breaks it before the answer began and ``reopen`` sends
        the request again, the new response's chunks go on from there (once), after
        ``restart`` (what reads the chunks forgets the broken one's last, partial event)."""
        call = answer.call
        if first is not None:
            try:
                async for chunk in self.sender.watched(call, first, answer.timer, answer.noted):
                    yield chunk
                return
            except GatewayError as error:
                broke = error
        assert broke is not None
        if reopen is None or call.exchange.stage == ANSWERING:
            raise broke
        opened = await reopen(broke)
        if opened is None:
            raise broke
        upstream, timer, progress = opened
        await answer.swap(upstream, timer, progress)
        if restart is not None:
            restart()
        content_type = upstream.headers.get("content-type", "")
        if upstream.status_code != 200 or "event-stream" not in content_type:
            raise BackendUnavailable(
                f"The backend for '{call.spec.entry.id}' answered the request sent again "
                f"with HTTP {upstream.status_code}, not a stream",
                code="backend_error",
            )
        async for chunk in self.sender.watched(call, read(upstream), timer, answer.noted):
            yield chunk


async def _whole(
    call: Call,
    status: int,
    content_type: str,
    encoding: str | None,
    content: bytes,
    translation: Translation | None,
) -> Response | WholeAnswer:
    """The answer to a request whose backend answered in one piece."""
    exchange = call.exchange
    if encoding is not None:  # passed on with the encoding it needs to be read
        return WholeAnswer(
            exchange, content, status, content_type, headers={"content-encoding": encoding}
        )
    if status >= 400:
        error = backend_error_body if translation is None else translation.error_body
        return WholeAnswer(exchange, error(status, content), status, JSON)
    body_json: Any = None
    if "json" in content_type and translation is not None:
        try:
            body_json = json.loads(content)
        except (ValueError, RecursionError):
            body_json = None
    elif "json" in content_type:
        body_json = answer_fields(content)  # only for the record: floats kept as text
    if translation is not None:
        if not isinstance(body_json, dict):
            return WholeAnswer(exchange, translation.error_body(502, content), 502, JSON)
        result = await translation.whole(body_json)
        exchange.note_response(result)
        return JSONResponse(result)
    if isinstance(body_json, dict):
        exchange.note_response(body_json)
    return WholeAnswer(exchange, content, status, content_type)


def _dumps(answer: dict[str, Any]) -> bytes:
    """An answer as llama-server writes one: compact, its keys in order, UTF-8."""
    return json.dumps(answer, ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode()


async def _tapped(chunks: AsyncIterator[bytes], tap: Tap) -> AsyncIterator[bytes]:
    """The stream as the client gets it: each event checked and noted on the way."""
    async for chunk in chunks:
        forward = tap.feed(chunk)
        if forward:
            yield forward
    rest = tap.flush()
    if rest:
        yield rest
    if tap.error is not None:
        tap.exchange.error_type = "backend_stream_error"


__all__ = ["Replies"]
