"""No silent waits: what a streamed answer's client is sent while it waits for the
answer's first bytes — in the admission queue, for an on-demand load or a restart, for
the backend's head, while the prompt is read.

A :class:`KeepAlive` says how often and what: its API shape's own keep-alive (an SSE
comment; the Messages API's ``ping`` event), preceded by a progress line (an SSE
comment, ``: slm-progress {...}``) where the client asked for one with the
``X-SLM-Progress`` header. Nothing is sent while bytes flow: a beat is due only after
``interval`` seconds with nothing sent.

Two phases, each cheap when nothing waits (a timer, no task):

* before the answer's head: :class:`Heartbeat` sends the head of a stream (200,
  ``text/event-stream``) and a beat each interval from a task of its own while the
  request's task waits; the orchestrator stops it before it answers, and an answer
  that comes after the head went out is given in band (:mod:`slm_server.router.proxy`).
* after the head, until the first byte of the answer: :func:`first_beating` (the
  relay that reads the stream) and the splice's own timer
  (:class:`~slm_server.router.answer.stream_splice.Splice`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Final

from starlette.types import Message, Send

from slm_server.router.call.exchange import ANSWERING, Exchange

# The header a client sends (any value but 0/false/no) to be told its request's progress.
PROGRESS_HEADER: Final = b"x-slm-progress"
PROGRESS_LINE: Final = b": slm-progress "
# Every relayed stream's own headers (its content type aside): no cache, no buffering.
STREAM_HEADERS: Final = {"cache-control": "no-cache", "x-accel-buffering": "no"}
_START_HEADERS: Final = (
    (b"content-type", b"text/event-stream"),
    *((k.encode(), v.encode()) for k, v in STREAM_HEADERS.items()),
)


class KeepAlive:
    """One streamed request's keep-alives: every ``interval`` seconds of silence,
    ``beat()`` (the shape's ``keepalive`` bytes, after a progress line when
    ``report``)."""

    __slots__ = ("exchange", "interval", "keepalive", "report")

    def __init__(self, interval: float, keepalive: bytes, exchange: Exchange, report: bool) -> None:
        self.interval = interval
        self.keepalive = keepalive
        self.exchange = exchange
        self.report = report

    def beat(self) -> bytes:
        if not self.report:
            return self.keepalive
        line = json.dumps(self.exchange.waiting(time.perf_counter()), separators=(",", ":"))
        return PROGRESS_LINE + line.encode() + b"\n\n" + self.keepalive


def asks_progress(value: str | None) -> bool:
    """Whether an ``X-SLM-Progress`` header's value asks for progress lines."""
    return value is not None and value.strip().lower() not in ("", "0", "false", "no")


class Heartbeat:
    """The beats of a streamed request before its answer is ready: every ``interval``
    seconds from :meth:`arm` until :meth:`stop`, the stream's head (the first time)
    and a beat go out through ``send``, from a task of their own. ``started`` says
    whether the head went out: the answer must then continue that stream."""

    __slots__ = ("_handle", "_loop", "_send", "_task", "keepalive", "started")

    def __init__(self, send: Send, keepalive: KeepAlive, loop: asyncio.AbstractEventLoop) -> None:
        self._send = send
        self.keepalive = keepalive
        self._loop = loop
        self._handle: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None
        self.started = False

    def arm(self) -> None:
        self._handle = self._loop.call_later(self.keepalive.interval, self._due)

    def _due(self) -> None:
        self._handle = self._loop.call_later(self.keepalive.interval, self._due)
        task = self._task
        if task is None or task.done():
            self._task = self._loop.create_task(self._beat())

    async def _beat(self) -> None:
        send = self._send
        if not self.started:
            self.started = True
            start: Message = {
                "type": "http.response.start",
                "status": 200,
                "headers": list(_START_HEADERS),
            }
            await send(start)
        await send({"type": "http.response.body", "body": self.keepalive.beat(), "more_body": True})

    async def stop(self) -> bool:
        """No more beats (one under way finishes first); whether the head went out."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        task, self._task = self._task, None
        if task is not None:
            # A client gone, its send failing, is told by the waits and the relay.
            with contextlib.suppress(Exception):
                await task
        return self.started

    def cancel(self) -> None:
        """No more beats, at once (the request's task is being cancelled)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._task = None


async def first_beating(
    chunks: AsyncIterator[bytes],
    send_body: Callable[[bytes], Awaitable[None]],
    keepalive: KeepAlive,
) -> AsyncIterator[bytes]:
    """``chunks``, with a beat sent through ``send_body`` each ``interval`` seconds
    that passes with no chunk, until the answer itself begins (the exchange's stage is
    ``answering``: a translated stream's opening events, sent before the prompt is
    read, are not the answer yet); from there on the chunks as they come (no task per
    chunk)."""
    iterator = aiter(chunks)
    interval = keepalive.interval
    exchange = keepalive.exchange
    while exchange.stage != ANSWERING:
        following = asyncio.ensure_future(anext(iterator))
        try:
            while True:
                done, _ = await asyncio.wait((following,), timeout=interval)
                if done:
                    break
                await send_body(keepalive.beat())
        finally:
            if not following.done():
                following.cancel()
                await asyncio.wait((following,))  # its end, whatever it is
        try:
            chunk = following.result()
        except StopAsyncIteration:
            return
        yield chunk
    async for chunk in iterator:
        yield chunk


__all__ = [
    "PROGRESS_HEADER",
    "STREAM_HEADERS",
    "Heartbeat",
    "KeepAlive",
    "asks_progress",
    "first_beating",
]
