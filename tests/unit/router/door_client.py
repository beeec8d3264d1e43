"""The router's door in-process: the real door protocol (``door_protocol(limits)``,
uvicorn's httptools protocol with the router's limits and fast path) serving an ASGI
app over :class:`ClientEnd`, a fake asyncio transport standing for one client
connection, with no socket. What the door writes is parsed back into the client's
answer as it arrives (``httptools``' response parser), so a request takes the path
every real request takes: the door's :class:`~slm_server.router.call.fast_path.FastPath`
(the client's presence, the body taken whole, whole answers in one write, a stream's
pieces spliced) and uvicorn's cycle, where a plain ASGI call takes none of it.

:func:`door_for` is the one way the unit tests build the door: on a :class:`ClientEnd`
here, or on a plainer fake transport for the door's own tests, where what matters is
the bytes written and the flow control (:class:`Recording`, which keeps every write;
:class:`Reading`, which also counts resumed reads; :class:`Unread`, whose peer reads
nothing unless told to).
"""

from __future__ import annotations

import asyncio
import time
import weakref
from typing import Any, Protocol

import httptools
import uvicorn
from starlette.types import ASGIApp
from uvicorn.server import ServerState

from slm_server.router.edge.http_protocol import door_protocol
from slm_server.settings import DoorLimits

# As the running server's, but a fixed date (uvicorn's server sets it once a second).
DATE = (b"date", b"Thu, 01 Jan 2026 00:00:00 GMT")
PEERS = {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}


class Received(Protocol):
    """What the client received (``inprocess.Answer``), filled as it arrives."""

    status: int
    headers: dict[str, str]
    chunks: list[bytes]
    complete: bool


class ClientEnd:
    """One client connection as the door sees it: an asyncio transport whose writes
    are the client's to read (parsed into ``answer``; ``wire`` keeps the bytes). Like
    asyncio's transports, :meth:`close` tells the protocol its connection is lost on
    the loop's next turn, :meth:`abort` at once, and nothing written after either
    reaches the client. :meth:`leave` is the client closing its end."""

    def __init__(self, answer: Received) -> None:
        self.answer = answer
        self.wire: list[bytes] = []
        self.protocol: Any = None
        self.closed = False
        self.lost = False
        self.reading_paused = False
        self._parser = httptools.HttpResponseParser(self)
        self._headers: dict[str, str] = {}

    # -- the transport, as the door uses it -----------------------------------------

    def write(self, data: bytes) -> None:
        if self.closed:
            return
        self.wire.append(data)
        self._parser.feed_data(data)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            asyncio.get_running_loop().call_soon(self._lose)

    def abort(self) -> None:
        self.closed = True
        self._lose()

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return PEERS.get(name, default)

    def pause_reading(self) -> None:
        self.reading_paused = True

    def resume_reading(self) -> None:
        self.reading_paused = False

    def get_write_buffer_size(self) -> int:
        return 0

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    # -- the client -----------------------------------------------------------------

    def leave(self) -> None:
        """The client closes its end: the door hears its connection is lost."""
        self.closed = True
        self._lose()

    def _lose(self) -> None:
        if not self.lost:
            self.lost = True
            self.protocol.connection_lost(None)

    # -- httptools' response parser callbacks ---------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if status >= 200:  # an interim answer (100 Continue) is not the answer
            self.answer.status = status
            self.answer.headers = self._headers
        self._headers = {}

    def on_body(self, body: bytes) -> None:
        self.answer.chunks.append(body)

    def on_message_complete(self) -> None:
        if self.answer.status:
            self.answer.complete = True


class Recording:
    """A transport that keeps every write."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False
        self.protocol: Any = None  # set by door_for

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 5000)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def set_write_buffer_limits(self, *args: Any, **kwargs: Any) -> None:
        pass


class Reading(Recording):
    """Also counts how often reading was resumed."""

    def __init__(self) -> None:
        super().__init__()
        self.resumed = 0

    def resume_reading(self) -> None:
        self.resumed += 1


class Unread(Recording):
    """A client connection whose peer reads nothing unless told to: like asyncio's
    transport, it asks the protocol to pause writing once its buffer passes the
    high-water mark; it resumes only when the peer reads (:meth:`read_by_peer`); an
    abort drops the buffer and tells the protocol its connection is lost."""

    HIGH_WATER = 64 * 1024

    def __init__(self) -> None:
        super().__init__()
        self.buffered = 0
        self.paused = False
        self.aborted_at: float | None = None

    def write(self, data: bytes) -> None:
        if self.aborted_at is not None:
            return
        self.buffered += len(data)
        if self.buffered > self.HIGH_WATER and not self.paused:
            self.paused = True
            self.protocol.pause_writing()

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def read_by_peer(self) -> None:
        """The peer took everything: the buffer is empty, writing resumes."""
        self.buffered = 0
        if self.paused:
            self.paused = False
            self.protocol.resume_writing()

    def abort(self) -> None:
        if self.aborted_at is None:
            self.aborted_at = time.monotonic()
            self.closed = True
            self.buffered = 0
            self.protocol.connection_lost(None)


_configs: weakref.WeakKeyDictionary[Any, uvicorn.Config] = weakref.WeakKeyDictionary()


def config_for(app: ASGIApp) -> uvicorn.Config:
    """uvicorn's configuration as the router's command sets it (no proxy headers, no
    access log, no WebSocket, no lifespan: a test runs the app's lifespan itself),
    loaded once."""
    config = _configs.get(app)
    if config is None:
        config = uvicorn.Config(
            app,
            log_config=None,
            access_log=False,
            proxy_headers=False,
            ws="none",
            lifespan="off",
        )
        config.load()
        _configs[app] = config
    return config


def door_for(app: ASGIApp, end: Any, limits: DoorLimits | None = None) -> Any:
    """The door protocol serving ``app`` (with ``limits``, else the defaults), connected
    to ``end`` (a fake transport; it is given the protocol as ``end.protocol``), as the
    router's server makes one for each connection."""
    config = config_for(app)
    state = ServerState()
    state.default_headers = [DATE, *config.encoded_headers]
    protocol = door_protocol(limits or DoorLimits())(
        config=config, server_state=state, app_state={}
    )
    end.protocol = protocol
    protocol.connection_made(end)
    return protocol


async def through_door(
    app: ASGIApp,
    request: bytes,
    answer: Received,
    leave: asyncio.Event,
    limits: DoorLimits | None = None,
) -> ClientEnd:
    """Send ``request`` (its raw bytes) on a new connection to the door serving
    ``app``; return once its task has ended. The client leaves when ``leave`` is set,
    and after the answer in any case (then ``leave`` is set, as a plain ASGI call sets
    it)."""
    end = ClientEnd(answer)
    protocol = door_for(app, end, limits)

    async def leaving() -> None:
        await leave.wait()
        end.leave()

    watcher = asyncio.ensure_future(leaving())
    try:
        protocol.data_received(request)
        for task in list(protocol.tasks):  # the request's (a refusal at the door has none)
            await task
    finally:
        watcher.cancel()
        leave.set()
        end.leave()
    return end


__all__ = ["ClientEnd", "Reading", "Recording", "Unread", "config_for", "door_for", "through_door"]
