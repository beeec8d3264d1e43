"""A small HTTP/1.1 client for the backends (the router's upstream and the supervisor's
probes): asyncio and httptools' parser.

One :class:`Pool` per backend keeps its idle keep-alive connections; there is no cap
on how many are open at once. A request goes out on the most recently used idle
connection, else on a new one, and its :class:`Response` comes back once the status
line and headers have arrived; its body is then read whole (:meth:`Response.read`) or
as it arrives (:meth:`Response.receive`).

* **Framing**: ``Content-Length``, chunked and close-delimited bodies.
* **Keep-alive**: a connection goes back to the pool only when its whole response was
  received and neither side said ``Connection: close``; it is closed after
  ``idle_expiry`` seconds idle (2 s: well before the backends' own 5 s), and never
  reused once that time has passed.
* **Closing early**: closing a response before its end closes the TCP connection, so
  the backend sees its client leave and stops generating.
* **Flow control**: past ``HIGH_WATER`` unread bytes the connection stops reading from
  the socket until the reader takes them, so a slow reader never makes it buffer an
  unbounded stream (the kernel's buffers then push back on the backend).
* **Splicing**: a body can instead be handed, piece by piece as the parser delivers
  it, to a callback (:meth:`Response.splice`), with no task woken per piece; the
  callback's owner pauses and resumes reading (:meth:`Response.pause`,
  :meth:`Response.resume`) and waits for the end with :meth:`Response.settle`.
* **Timeouts**: ``connect_timeout`` for a new connection; ``read_timeout`` for any wait
  for the next bytes of a response (the status line, headers or body).
* **Retries**: a refused connect is tried once more; a request whose *reused*
  connection the backend had closed (EOF or reset before any byte of the answer) is
  sent once more on a new connection.

Failures raise :class:`HttpError` subclasses: :class:`ConnectError` (and
:class:`ConnectTimeout`), :class:`ReadTimeout` and :class:`ProtocolError` (a malformed
response, or :class:`ConnectionClosed`: the backend closed or reset the connection
before its response ended).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import ssl
from collections.abc import Callable, Iterator, Mapping
from typing import Final, cast, overload
from urllib.parse import urlsplit

import httptools

IDLE_EXPIRY: Final = 2.0
# Unread body bytes past which a connection stops reading from its socket.
HIGH_WATER: Final = 256 * 1024
# Bodies up to this size go out in one write together with the request head.
_JOIN_BELOW: Final = 64 * 1024
# A response head (status line and headers) larger than this, or with more headers, is
# a protocol error: counted as its bytes arrive, so an endless head costs no more.
MAX_HEAD_BYTES: Final = 64 * 1024
MAX_HEADERS: Final = 256
# Timers may fire this early; a wait this close to its deadline has timed out.
_TIMER_SLACK: Final = 0.001
# What no header name may contain.
_BAD_NAME: Final = re.compile(r"[\s:]")


class HttpError(Exception):
    """Any failure talking to a backend."""


class ConnectError(HttpError):
    """No connection could be made (refused, unreachable, or timed out)."""


class ConnectTimeout(ConnectError):
    """The connection was not made within the connect timeout."""


class ReadTimeout(HttpError):
    """No byte of the response arrived within the read timeout."""


class ProtocolError(HttpError):
    """The backend's response is not valid HTTP/1.1, or the connection broke."""


class InvalidStatus(ProtocolError):
    """A response whose status code is outside 100-599 (RFC 9110 §15)."""

    def __init__(self, status: int) -> None:
        super().__init__(f"status {status} is outside 100-599")
        self.status = status


class ConnectionClosed(ProtocolError):
    """The backend closed or reset the connection before its response ended."""

    def __init__(self, message: str, *, before_response: bool) -> None:
        super().__init__(message)
        self.before_response = before_response


class Headers:
    """Response headers; names are case-insensitive, repeated ones joined by ``, ``."""

    __slots__ = ("_items",)

    def __init__(self, items: dict[str, str]) -> None:
        self._items = items  # lowercased names

    @classmethod
    def parse(cls, raw: list[tuple[bytes, bytes]]) -> Headers:
        """Linear in the headers, however many repeat one name."""
        values: dict[str, list[str]] = {}
        for name, value in raw:
            values.setdefault(name.decode("latin-1").lower(), []).append(value.decode("latin-1"))
        return cls({key: ", ".join(texts) for key, texts in values.items()})

    @overload
    def get(self, name: str) -> str | None: ...
    @overload
    def get(self, name: str, default: str) -> str: ...
    def get(self, name: str, default: str | None = None) -> str | None:
        return self._items.get(name.lower(), default)

    def __getitem__(self, name: str) -> str:
        return self._items[name.lower()]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def items(self) -> Iterator[tuple[str, str]]:
        return iter(self._items.items())

    def __repr__(self) -> str:
        return f"Headers({self._items!r})"


class _Connection(asyncio.Protocol):
    """One TCP connection to a backend and the state of the exchange on it."""

    def __init__(self, pool: Pool, loop: asyncio.AbstractEventLoop) -> None:
        self.pool = pool
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.reused = False
        self.idle_since = 0.0
        self.read_timeout = pool.read_timeout
        self.timer: asyncio.TimerHandle | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.deadline = 0.0
        self.paused = False
        self._reset()

    def _reset(self) -> None:
        """A fresh exchange: nothing of a response seen yet."""
        self.active = False
        self.received = False
        self.status = 0
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self.head_bytes = 0
        self.headers = Headers({})
        self.headers_done = False
        self.interim = False
        self.done = False
        self.keep_alive = False
        self.until_eof = False
        self.body: list[bytes] = []
        self.buffered = 0
        self.error: HttpError | None = None
        self.sink: Callable[[bytes], None] | None = None

    # -- the exchange ---------------------------------------------------------

    async def exchange(self, head: bytes, body: bytes, read_timeout: float) -> Response:
        """Send one request; return once the response's headers are in."""
        self._reset()
        self.active = True
        self.read_timeout = read_timeout
        transport = self.transport
        assert transport is not None
        try:
            if len(body) < _JOIN_BELOW:
                transport.write(head + body if body else head)
            else:
                transport.write(head)
                transport.write(body)
            while not self.headers_done:
                if self.error is not None:
                    raise self.error
                await self.wait()
        except BaseException:
            self.close()
            raise
        return Response(self)

    async def wait(self) -> None:
        """Until the response makes progress, fails, or the read timeout passes."""
        loop = self.loop
        waiter = loop.create_future()
        self.waiter = waiter
        deadline = self.deadline = loop.time() + self.read_timeout
        timer = self.timer
        if timer is None or timer.when() > deadline:
            # One timer per connection, moved only when a wait ends sooner than it.
            if timer is not None:
                timer.cancel()
            self.timer = loop.call_at(deadline, self._check_timeout)
        try:
            await waiter
        finally:
            self.waiter = None

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _check_timeout(self) -> None:
        self.timer = None
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        if self.loop.time() + _TIMER_SLACK < self.deadline:
            self.timer = self.loop.call_at(self.deadline, self._check_timeout)
            return
        self.fail(ReadTimeout(f"no data from the backend for {self.read_timeout:g}s"))

    def take(self) -> bytes:
        """Every body byte received and not yet taken, in one piece."""
        body = self.body
        data = body[0] if len(body) == 1 else b"".join(body)
        body.clear()
        self.buffered = 0
        self.resume_reading()
        return data

    def pause_reading(self) -> None:
        """Stop reading from the socket until :meth:`resume_reading`; wakes a waiter."""
        if self.paused:
            return
        self.paused = True
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()
        self._wake()

    def resume_reading(self) -> None:
        if not self.paused:
            return
        self.paused = False
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def fail(self, error: HttpError) -> None:
        """End the exchange with ``error`` and close the connection."""
        if self.error is None:
            self.error = error
        self.close()
        self._wake()

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.abort()
        self.pool.forget(self)

    # -- asyncio.Protocol -----------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if not self.active or self.done:
            # Bytes no request asked for: this connection can no longer be trusted.
            self.fail(ProtocolError("the backend sent bytes after its response"))
            return
        self.received = True
        if not self.headers_done:
            self.head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._deliver()
            self.fail(ProtocolError("the backend switched protocols"))
        except httptools.HttpParserError as exc:
            self._deliver()
            cause = exc.__context__
            if isinstance(cause, InvalidStatus):
                self.fail(cause)
                return
            shown = cause if isinstance(cause, ProtocolError) else exc
            self.fail(ProtocolError(f"malformed response: {shown}"))
            return
        if self.sink is not None:
            self._deliver()
        if not self.headers_done and self.head_bytes > MAX_HEAD_BYTES:
            self.fail(ProtocolError(f"a response head larger than {MAX_HEAD_BYTES} bytes"))

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.pool.forget(self)
        if self.closed:
            return
        self.closed = True
        if not self.active or self.done or self.error is not None:
            return
        if self.headers_done and self.until_eof and exc is None:
            self.done = True  # a close-delimited body ends here
        elif not self.received:
            how = "reset" if exc is not None else "closed"
            self.error = ConnectionClosed(
                f"the backend {how} the connection before answering", before_response=True
            )
        else:
            self.error = ConnectionClosed(
                "the backend closed the connection before its response ended",
                before_response=False,
            )
        self._wake()

    # -- httptools callbacks --------------------------------------------------

    def on_message_begin(self) -> None:
        if self.headers_done:
            raise ProtocolError("a second response to one request")
        self.raw_headers = []

    def on_header(self, name: bytes, value: bytes) -> None:
        self.raw_headers.append((name, value))
        if len(self.raw_headers) > MAX_HEADERS:
            raise ProtocolError(f"more than {MAX_HEADERS} response headers")

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if not 100 <= status <= 599:
            raise InvalidStatus(status)
        if status < 200:
            self.interim = True  # 100 Continue and the like: the answer follows
            return
        headers = Headers.parse(self.raw_headers)
        framed = "content-length" in headers or headers.get(
            "transfer-encoding", ""
        ).strip().lower().endswith("chunked")
        self.status = status
        self.headers = headers
        self.keep_alive = self.parser.should_keep_alive()
        self.until_eof = not framed and status not in (204, 304)
        self.headers_done = True
        self._wake()

    def _deliver(self) -> None:
        """Spliced: what one read's pieces of the body make, in one call of the sink
        (a read may hold many chunks of a chunked body: one write for them all)."""
        sink, body = self.sink, self.body
        if sink is None or not body:
            return
        data = body[0] if len(body) == 1 else b"".join(body)
        body.clear()
        self.buffered = 0
        # The read timeout counts from these bytes (moved, not re-armed: the timer
        # checks the deadline when it fires).
        self.deadline = self.loop.time() + self.read_timeout
        sink(data)

    def on_body(self, body: bytes) -> None:
        self.body.append(body)
        if self.sink is not None:
            return  # spliced: handed on at the end of the read (_deliver)
        self.buffered += len(body)
        if self.buffered > HIGH_WATER:
            self.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self.interim:
            self.interim = False
            return
        self.done = True
        self._wake()


class Response:
    """A backend's response: status and headers, and a body still to be read.

    Read it whole with :meth:`read`, or piece by piece with :meth:`receive`; close it
    with :meth:`aclose` (or :meth:`close`) when done with it.
    """

    __slots__ = ("_conn", "headers", "status_code")

    def __init__(self, conn: _Connection) -> None:
        self._conn: _Connection | None = conn
        self.status_code = conn.status
        self.headers = conn.headers

    @property
    def buffered(self) -> int:
        """Body bytes received from the socket and not yet read."""
        return self._conn.buffered if self._conn is not None else 0

    @property
    def closed(self) -> bool:
        return self._conn is None

    @property
    def complete(self) -> bool:
        """Whether the whole body has arrived, so that reading it never waits."""
        conn = self._conn
        return conn is None or conn.done or conn.error is not None

    async def receive(self) -> bytes:
        """The next piece of the body (all that has arrived since the last call), or
        ``b""`` once the body is complete."""
        conn = self._conn
        if conn is None:
            return b""
        while not conn.body:
            if conn.done:
                self.close()
                return b""
            if conn.error is not None:
                self.close()
                raise conn.error
            await conn.wait()
        return conn.take()

    def spliceable(self) -> Response:
        """This response, whose body can be spliced (:meth:`splice`)."""
        return self

    def splice(self, sink: Callable[[bytes], None]) -> None:
        """From now on hand each piece of the body to ``sink`` as it is parsed (what
        arrived already first), instead of keeping it for :meth:`receive`. ``sink`` is
        called from the connection's protocol: it must not raise. A pause by
        :meth:`pause` holds the pieces back until :meth:`resume`."""
        conn = self._conn
        if conn is None:
            return
        conn.sink = sink
        if conn.body:
            sink(conn.take())

    def unsplice(self) -> None:
        """Keep the body's pieces for :meth:`receive` again."""
        if self._conn is not None:
            self._conn.sink = None

    def pause(self) -> None:
        """Stop reading from the socket (a spliced body's consumer is full); a
        :meth:`settle` under way returns."""
        if self._conn is not None:
            self._conn.pause_reading()

    def resume(self) -> None:
        """Read from the socket again after :meth:`pause`."""
        if self._conn is not None:
            self._conn.resume_reading()

    async def settle(self) -> bool:
        """For a spliced body: wait until it is complete (True, the response closed)
        or reading is paused (False); a broken body raises its :class:`HttpError`.
        The wait for the next bytes is bounded by the read timeout, as any is."""
        conn = self._conn
        if conn is None:
            return True
        while True:
            if conn.done:
                self.close()
                return True
            if conn.error is not None:
                self.close()
                raise conn.error
            if conn.paused:
                return False
            await conn.wait()

    async def read(self) -> bytes:
        """The rest of the body, whole."""
        conn = self._conn
        if conn is None:
            return b""
        parts: list[bytes] = []
        while True:
            if conn.body:
                parts.append(conn.take())
            if conn.done:
                break
            if conn.error is not None:
                self.close()
                raise conn.error
            await conn.wait()
        self.close()
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def close(self) -> None:
        """Done with the response: its connection goes back to the pool when the whole
        response arrived and may be kept alive, else it is closed."""
        conn = self._conn
        if conn is None:
            return
        self._conn = None
        conn.sink = None  # nothing of this response's reader stays with the connection
        if conn.done and conn.error is None:
            conn.pool.release(conn)
        else:
            conn.close()

    async def aclose(self) -> None:
        self.close()


class Pool:
    """Keep-alive connections to one backend, at ``base_url`` (``http://host:port``)."""

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout: float,
        read_timeout: float,
        idle_expiry: float = IDLE_EXPIRY,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or parts.hostname is None:
            raise ValueError(f"not an http:// or https:// URL with a host: {base_url!r}")
        self.host = parts.hostname
        # https (a remote engine's url): TLS with the system's trust store, verified.
        self.ssl: ssl.SSLContext | None = None
        if parts.scheme == "https":
            self.ssl = ssl.create_default_context()
        self.port = parts.port or (443 if self.ssl is not None else 80)
        self.authority = parts.netloc.rsplit("@", 1)[-1]
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.idle_expiry = idle_expiry
        self._idle: list[_Connection] = []  # oldest first
        self._open: set[_Connection] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self._closed = False

    @property
    def connections(self) -> int:
        """Connections open now, idle or in use."""
        return len(self._open)

    @property
    def idle(self) -> int:
        return sum(1 for conn in self._idle if not conn.closed)

    async def request(
        self,
        method: str,
        path: str,
        headers: Mapping[str, str] | None = None,
        body: bytes = b"",
        *,
        timeout: float | None = None,
    ) -> Response:
        """Send a request; the response once its headers arrived. ``timeout``, when
        given, replaces both the connect and the read timeout."""
        loop = self._bind()
        if self._closed:
            raise ConnectError("the client is closed")
        head = self._head(method, path, headers, body)
        read_timeout = self.read_timeout if timeout is None else timeout
        conn = self._take_idle(loop.time())
        if conn is None:
            conn = await self._connect(loop, timeout)
        try:
            return await conn.exchange(head, body, read_timeout)
        except ConnectionClosed as exc:
            if not (conn.reused and exc.before_response):
                raise
        # The backend closed the kept-alive connection just as it was reused: the
        # answer had not begun, so send once more on a new connection.
        conn = await self._connect(loop, timeout)
        return await conn.exchange(head, body, read_timeout)

    def _head(
        self, method: str, path: str, headers: Mapping[str, str] | None, body: bytes
    ) -> bytes:
        if method == "HEAD":
            raise ValueError("HEAD is not supported")  # its response has no body to read
        if not path.startswith("/") or " " in path or "\r" in path or "\n" in path:
            raise ValueError(f"not a request path: {path!r}")
        lines = [f"{method} {path} HTTP/1.1\r\nhost: {self.authority}\r\n"]
        if body or method != "GET":
            lines.append(f"content-length: {len(body)}\r\n")
        if headers:
            for name, value in headers.items():
                if not name or "\n" in value or "\r" in value or _BAD_NAME.search(name):
                    raise ValueError(f"header not allowed in a request: {name!r}")
                lines.append(f"{name}: {value}\r\n")
        lines.append("\r\n")
        return "".join(lines).encode("latin-1")

    def _bind(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is not None and loop.is_running():
            return loop  # the router's one loop (asking asyncio costs a getpid() on 3.11)
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            # Connections belong to the event loop that made them.
            for conn in list(self._open):
                with contextlib.suppress(RuntimeError):
                    conn.close()
            self._idle.clear()
            self._open.clear()
            self._sweeper = None
            self._loop = loop
        return loop

    def _take_idle(self, now: float) -> _Connection | None:
        idle = self._idle
        while idle:
            conn = idle.pop()
            if conn.closed:
                continue
            if now - conn.idle_since >= self.idle_expiry:
                # This one and every older one below it have expired.
                conn.close()
                for old in idle:
                    old.close()
                idle.clear()
                return None
            conn.reused = True
            return conn
        return None

    async def _connect(self, loop: asyncio.AbstractEventLoop, timeout: float | None) -> _Connection:
        limit = self.connect_timeout if timeout is None else timeout
        where = f"{self.host}:{self.port}"
        for attempt in (1, 2):
            try:
                async with asyncio.timeout(limit):
                    _, conn = await loop.create_connection(
                        lambda: _Connection(self, loop), self.host, self.port, ssl=self.ssl
                    )
            except TimeoutError:
                raise ConnectTimeout(f"no connection to {where} within {limit:g}s") from None
            except ConnectionRefusedError as exc:
                if attempt == 1:
                    continue
                raise ConnectError(f"connection to {where} refused") from exc
            except OSError as exc:
                raise ConnectError(f"cannot connect to {where}: {exc}") from exc
            self._open.add(conn)
            return conn
        raise AssertionError("unreachable")  # pragma: no cover

    def release(self, conn: _Connection) -> None:
        """Take back a connection whose response was received whole."""
        conn.resume_reading()
        if conn.closed or not conn.keep_alive or self._closed or conn.loop is not self._loop:
            conn.close()
            return
        conn.body.clear()
        conn.active = False
        loop = conn.loop
        conn.idle_since = loop.time()
        self._idle.append(conn)
        if self._sweeper is None:
            self._sweeper = loop.call_at(conn.idle_since + self.idle_expiry, self._sweep)

    def forget(self, conn: _Connection) -> None:
        self._open.discard(conn)

    def _sweep(self) -> None:
        """Close the connections idle for ``idle_expiry``; come back for the next."""
        self._sweeper = None
        loop = self._loop
        if loop is None:
            return
        idle = self._idle
        limit = loop.time() - self.idle_expiry + _TIMER_SLACK
        cut = 0
        while cut < len(idle) and (idle[cut].closed or idle[cut].idle_since <= limit):
            idle[cut].close()
            cut += 1
        del idle[:cut]
        if idle:
            self._sweeper = loop.call_at(idle[0].idle_since + self.idle_expiry, self._sweep)

    def close(self) -> None:
        """Close every connection, idle or in use; later requests fail."""
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for conn in list(self._open):
            conn.close()
        self._idle.clear()
