"""A whole answer written straight through the door (:meth:`DoorRequest.answer`, as
:class:`WholeAnswer` uses it) is what uvicorn writes for the same answer sent as ASGI
messages, in one write, and leaves the connection as uvicorn leaves it; driven
in-process on a recording transport."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from slm_server.router.answer.whole_answer import WholeAnswer
from slm_server.router.call.exchange import exchange_of
from slm_server.router.call.fast_path import FAST_PATH
from tests.unit.router.door_client import Recording, door_for

POST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
    b"content-type: application/json\r\ncontent-length: 2\r\n%b\r\n{}"
)


def served(app: ASGIApp, *requests: bytes) -> tuple[Any, Recording]:
    """``requests`` sent one after the other on one connection, each answered."""

    async def run() -> tuple[Any, Recording]:
        transport = Recording()
        protocol = door_for(app, transport)
        for request in requests:
            protocol.data_received(request)
            await asyncio.gather(*protocol.tasks)
            await asyncio.sleep(0)  # a held head goes out on the loop's next turn
        return protocol, transport

    return asyncio.run(run())


def parsed(wire: bytes) -> tuple[bytes, list[tuple[bytes, bytes]], bytes]:
    """Status line, headers in their order (but the date) and body."""
    head, _, body = wire.partition(b"\r\n\r\n")
    status, *lines = head.split(b"\r\n")
    headers = [(n.lower(), v) for n, v in (line.split(b": ", 1) for line in lines)]
    return status, [h for h in headers if h[0] != b"date"], body


OK = b'{"ok":1}'


def whole(
    media_type: str, headers: dict[str, str] | None = None, status: int = 200, body: bytes = OK
) -> ASGIApp:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        exchange = exchange_of(scope)
        await WholeAnswer(exchange, body, status, media_type, headers)(scope, receive, send)

    return app


def starlette(
    media_type: str, headers: dict[str, str] | None = None, status: int = 200, body: bytes = OK
) -> ASGIApp:
    """The same answer as a Starlette Response, the request id echoed as the router's
    middleware echoes it on an ASGI response."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        exchange = exchange_of(scope)
        response = Response(body, status, headers, media_type)
        response.raw_headers.append((b"x-request-id", exchange.request_id.encode()))
        await response(scope, receive, send)

    return app


@pytest.mark.parametrize(
    ("media_type", "headers", "status", "body", "writes"),
    [
        ("application/json", None, 200, OK, 1),
        ("text/plain", None, 503, OK, 1),
        ("text/plain; Charset=latin-1", None, 200, OK, 1),
        ("application/json", {"Content-Encoding": "gzip"}, 200, OK, 1),
        # No body, no length: left to ASGI, with the headers Starlette gives it.
        ("application/json", None, 204, b"", 2),
        ("application/json", None, 304, b"", 2),
    ],
)
def test_a_direct_answer_is_the_answer_uvicorn_writes_in_one_write(
    media_type: str, headers: dict[str, str] | None, status: int, body: bytes, writes: int
) -> None:
    _, direct = served(whole(media_type, headers, status, body), POST % b"")
    _, asgi = served(starlette(media_type, headers, status, body), POST % b"")
    assert len(direct.writes) == writes
    mine, theirs = parsed(b"".join(direct.writes)), parsed(b"".join(asgi.writes))
    # The request ids differ (one per request); everything else is the same, in order.
    assert [h for h in mine[1] if h[0] != b"x-request-id"] == [
        h for h in theirs[1] if h[0] != b"x-request-id"
    ]
    assert mine[0] == theirs[0] == b"HTTP/1.1 %d " % status + mine[0].split(b" ", 2)[2]
    assert mine[2] == theirs[2] == body
    # Written directly, the answer carries the request id itself; through ASGI the
    # router's observer adds it (there is none here).
    assert [n for n, _ in mine[1]].count(b"x-request-id") == (1 if writes == 1 else 0)
    assert not direct.closed


def test_the_exchange_gets_the_status_and_the_client_its_request_id() -> None:
    seen: dict[str, Any] = {}

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        exchange = exchange_of(scope)
        await WholeAnswer(exchange, b"{}", 201, "application/json")(scope, receive, send)
        seen["status"], seen["id"] = exchange.status, exchange.request_id

    _, transport = served(app, POST % b"")
    _, headers, _ = parsed(transport.writes[0])
    assert seen["status"] == 201
    assert (b"x-request-id", seen["id"].encode()) in headers


def test_the_connection_stays_open_for_the_next_request() -> None:
    protocol, transport = served(whole("application/json"), POST % b"", POST % b"")
    assert len(transport.writes) == 2
    assert all(w.startswith(b"HTTP/1.1 200 OK\r\n") for w in transport.writes)
    assert not transport.closed
    assert protocol.cycle.response_complete


def test_a_client_that_asked_for_close_gets_it_and_the_connection_closes() -> None:
    _, transport = served(whole("application/json"), POST % b"connection: close\r\n")
    _, headers, _ = parsed(transport.writes[0])
    assert (b"connection", b"close") in headers
    assert transport.closed


def test_nothing_is_written_to_a_client_that_left() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await left.wait()
        await WholeAnswer(exchange_of(scope), b"{}", 200, "application/json")(scope, receive, send)

    async def run() -> Recording:
        transport = Recording()
        protocol = door_for(app, transport)
        protocol.data_received(POST % b"")
        protocol.connection_lost(None)
        left.set()
        await asyncio.gather(*protocol.tasks)
        return transport

    left = asyncio.Event()
    transport = asyncio.run(run())
    assert transport.writes == []


def test_an_answer_already_begun_or_to_a_head_is_left_to_asgi() -> None:
    results: list[bool] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        direct = scope["extensions"][FAST_PATH]
        if scope["method"] == "HEAD":
            results.append(await direct.answer(200, [], b"x"))
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        results.append(await direct.answer(200, [], b"x"))
        await send({"type": "http.response.body", "body": b""})

    head = b"HEAD / HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n"
    _, transport = served(app, head, POST % b"")
    assert results == [False, False]
    assert b"x" not in b"".join(transport.writes).split(b"\r\n\r\n")[-1]


@pytest.mark.parametrize(
    ("headers", "error"),
    [
        ([(b"content-type", b"a\nb")], "Invalid HTTP header value."),
        ([(b"content-length", b"3")], "Response content length is not the body's"),
    ],
)
def test_a_bad_header_is_refused_unwritten(headers: list[tuple[bytes, bytes]], error: str) -> None:
    errors: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        direct = scope["extensions"][FAST_PATH]
        try:
            await direct.answer(200, headers, b"{}")
        except RuntimeError as raised:
            errors.append(str(raised))
        await send({"type": "http.response.start", "status": 500, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    _, transport = served(app, POST % b"")
    assert errors == [error]
    assert b"".join(transport.writes).startswith(b"HTTP/1.1 500 ")


def test_an_answer_refused_unwritten_leaves_the_status_to_the_error() -> None:
    seen: dict[str, Any] = {}

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        exchange = exchange_of(scope)
        try:
            await WholeAnswer(exchange, b"{}", 200, "application/json\x01")(scope, receive, send)
        except RuntimeError:
            seen["status"] = exchange.status
        await send({"type": "http.response.start", "status": 500, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    _, transport = served(app, POST % b"")
    assert seen == {"status": None}
    assert b"".join(transport.writes).startswith(b"HTTP/1.1 500 ")
