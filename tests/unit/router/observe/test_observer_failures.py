"""What the router does when it fails itself: before a request's answer, halfway
through it, after it, or while recording it (metrics, span, recent requests, access
log). Each failure is logged once, with its traceback and the request's id; the client
gets an OpenAI-shaped 500 carrying its request id when nothing was sent yet, keeps a
whole answer and its keep-alive connection when one went out (never a second answer
attempted: uvicorn's "Unexpected ASGI message"), and sees a stream cut when it failed
halfway; the request always keeps its access line. Driven in-process through the real
door protocol on a recording transport, two requests pipelined on one connection."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from slm_server.router.answer.whole_answer import WholeAnswer
from slm_server.router.call.exchange import Exchange, exchange_of
from slm_server.router.dispatch.lookup import Registry
from slm_server.router.observe.metrics import Metrics, outcome_of
from slm_server.router.observe.observer import RequestObserver
from slm_server.router.observe.telemetry import Telemetry
from slm_server.settings import TelemetrySettings
from tests.unit.router.door_client import Recording, door_for
from tests.unit.router.inprocess import (
    FakeStates,
    Router,
    Sent,
    call,
    make_router,
    sse,
    whole,
)

ANSWER = {"id": "chatcmpl-1", "object": "chat.completion", "choices": []}


def request(path: bytes, body: bytes) -> bytes:
    return (
        b"POST %b HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%b" % (path, len(body), body)
    )


def serve_twice(app: ASGIApp, wire: bytes) -> Recording:
    """``wire`` sent twice on one connection, pipelined; every answer awaited."""

    async def run() -> Recording:
        transport = Recording()
        protocol = door_for(app, transport)
        protocol.data_received(wire + wire)
        for _ in range(100):  # the pipelined one starts once the first has ended
            await asyncio.gather(*protocol.tasks)
            await asyncio.sleep(0)
            if not protocol.tasks and not protocol.pipeline:
                break
        return transport

    return asyncio.run(run())


def statuses(transport: Recording) -> list[bytes]:
    return re.findall(rb"HTTP/1\.1 (\d{3}) ", b"".join(transport.writes))


def assert_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    """Nothing logged by uvicorn for the error: no second traceback, no second answer."""
    text = caplog.text
    assert "Unexpected ASGI message" not in text
    assert "Exception in ASGI application" not in text


def errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.ERROR]


def answering_router(tmp_path: Path) -> Router:
    """An in-process router whose backend answers every request with ``ANSWER``."""

    async def script(sent: Sent) -> Any:
        return whole(ANSWER)

    return make_router(tmp_path, script)


def break_method(target: object, method: str, failing: str) -> None:
    """``target.method`` raises ``ValueError("<failing> broke")`` from now on."""

    def broken(*_args: Any) -> Any:
        raise ValueError(f"{failing} broke")

    setattr(target, method, broken)


@pytest.mark.parametrize("failing", ["metrics", "telemetry", "recent"])
def test_a_recorder_that_fails_leaves_the_answer_the_connection_and_the_access_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, failing: str
) -> None:
    router = answering_router(tmp_path)
    observer = router.app.user_middleware[0]
    assert observer.cls is RequestObserver  # type: ignore[comparison-overlap]
    target = {"metrics": router.deps.metrics, "telemetry": router.deps.telemetry}.get(failing)
    if target is None:  # the dashboard's recent requests, made by create_app
        target = observer.kwargs["recent"]
    method = {"metrics": "observe", "telemetry": "close_span", "recent": "record"}[failing]
    break_method(target, method, failing)
    if failing == "telemetry":  # telemetry is off here: a span to close all the same
        router.deps.telemetry.open_span = lambda *_args: object()  # type: ignore[method-assign,assignment]
    body = json.dumps(
        {"model": router.spec.entry.id, "messages": [{"role": "user", "content": "hi"}]}
    )
    with caplog.at_level(logging.INFO):
        transport = serve_twice(router.app, request(b"/v1/chat/completions", body.encode()))
    assert statuses(transport) == [b"200", b"200"]
    assert not transport.closed, "a connection whose answers went out well was closed"
    failures = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(failures) == 2, [r.getMessage() for r in failures]
    assert all(
        r.exc_info is not None and str(r.exc_info[1]) == f"{failing} broke" for r in failures
    )
    access = [r for r in caplog.records if r.name == "slm_server.access"]
    assert len(access) == 2 and all(" 200 " in r.getMessage() for r in access)
    assert_logged_once(caplog)


class AnswerThenFail:
    """A whole answer written straight through the door, then an error."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        exchange = exchange_of(scope)
        await WholeAnswer(exchange, b'{"ok":1}', 200, "application/json")(scope, receive, send)
        raise ValueError("broke after answering")


class FailAtOnce:
    """An error before anything is sent."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raise KeyError("bug")


class StartThenFail:
    """A stream's head and first piece, then an error: the answer is cut."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        raise ValueError("broke halfway")


def observed(endpoint: ASGIApp) -> tuple[Starlette, list[Exchange]]:
    """``endpoint`` behind the router's observer, and the exchanges it recorded."""
    metrics = Metrics(Registry([]), FakeStates())
    seen: list[Exchange] = []
    observe = metrics.observe

    def keep(exchange: Exchange) -> str:
        seen.append(exchange)
        return observe(exchange)

    metrics.observe = keep  # type: ignore[method-assign]
    settings = TelemetrySettings.from_env({"SLM_OTEL_ENABLED": "false"})
    telemetry = Telemetry(settings, environ={})
    app = Starlette(
        routes=[Route("/v1/chat/completions", endpoint, methods=["POST"])],
        middleware=[Middleware(RequestObserver, telemetry=telemetry, metrics=metrics)],
    )
    return app, seen


def served_by(
    endpoint: ASGIApp, caplog: pytest.LogCaptureFixture
) -> tuple[Recording, list[Exchange]]:
    """Two requests to ``endpoint`` behind the observer, pipelined, logs captured."""
    app, seen = observed(endpoint)
    with caplog.at_level(logging.INFO):
        transport = serve_twice(app, request(b"/v1/chat/completions", b"{}"))
    return transport, seen


def test_an_error_raised_after_a_whole_answer_went_out_is_logged_once_and_the_connection_kept(
    caplog: pytest.LogCaptureFixture,
) -> None:
    transport, seen = served_by(AnswerThenFail(), caplog)
    assert statuses(transport) == [b"200", b"200"]
    assert not transport.closed
    failures = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.getMessage().split(" ", 2)[2] for r in failures] == [
        "failed after its answer was sent"
    ] * 2
    assert all(r.exc_info is not None and isinstance(r.exc_info[1], ValueError) for r in failures)
    # The request is still recorded as the router's failure it was.
    assert [(e.status, e.error_type) for e in seen] == [(200, "internal_error")] * 2
    assert [outcome_of(e) for e in seen] == ["router_error"] * 2
    assert_logged_once(caplog)


def test_an_error_raised_halfway_through_a_stream_still_cuts_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Half an answer is no answer: the server closes the connection, so the client
    sees the stream broken (uvicorn says, without a traceback, that the answer was not
    completed)."""
    transport, seen = served_by(StartThenFail(), caplog)
    assert statuses(transport) == [b"200"]
    assert transport.closed
    assert b"0\r\n\r\n" not in b"".join(transport.writes)  # never a clean end of the stream
    [failure] = [r for r in errors(caplog) if r.exc_info is not None]
    assert failure.getMessage().endswith(" failed during its answer")
    assert isinstance(failure.exc_info[1], ValueError)  # type: ignore[index]
    assert "Exception in ASGI application" not in caplog.text
    assert [(e.status, e.error_type) for e in seen] == [(200, "internal_error")]
    assert outcome_of(seen[0]) == "router_error"


def test_an_error_before_the_answer_is_one_500_with_the_request_id_and_one_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    transport, seen = served_by(FailAtOnce(), caplog)
    assert statuses(transport) == [b"500", b"500"]
    assert not transport.closed
    wire = b"".join(transport.writes)
    ids = re.findall(rb"x-request-id: (\w+)\r\n", wire)
    assert [i.decode() for i in ids] == [e.request_id for e in seen]
    bodies = [json.loads(b) for b in re.findall(rb"\r\n\r\n(\{[^\r]*\}\})", wire)]
    assert [b["error"]["code"] for b in bodies] == ["internal_error"] * 2
    failures = errors(caplog)
    assert [r.getMessage() for r in failures] == [
        f"request {e.request_id} failed unexpectedly" for e in seen
    ]
    assert all(r.exc_info is not None and isinstance(r.exc_info[1], KeyError) for r in failures)
    assert [(e.status, outcome_of(e)) for e in seen] == [(500, "router_error")] * 2
    assert_logged_once(caplog)


class ShortLastPiece:
    """A head that promises ten bytes and a last piece of three: uvicorn refuses the
    last send, so the answer never ended."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-length", b"10"), (b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"abc"})


def test_a_last_piece_that_never_went_out_is_no_answer_sent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    transport, seen = served_by(ShortLastPiece(), caplog)
    assert transport.closed
    [failure] = [r for r in errors(caplog) if r.exc_info is not None]
    assert failure.getMessage().endswith(" failed during its answer")
    assert [(e.answered, outcome_of(e)) for e in seen] == [(False, "router_error")]


class CancelledHalfway:
    """A stream's head, then a cancellation (as the server's shutdown cancels a task)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        raise asyncio.CancelledError


def test_a_cancelled_request_is_counted_cancelled_not_a_router_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    _, seen = served_by(CancelledHalfway(), caplog)
    assert [(e.error_type, outcome_of(e)) for e in seen] == [("cancelled", "cancelled")]
    assert not [r for r in errors(caplog) if r.name == "slm_server.router"]


@pytest.mark.usefixtures("via")  # through plain ASGI and through the door
def test_a_router_bug_while_relaying_a_stream_is_in_band_and_counted_a_router_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The stream's status is sent: the bug is reported as its last event, the stream
    ends cleanly, and the request is a router error, never an ``ok``."""
    first = {"id": "c1", "object": "chat.completion.chunk", "choices": []}

    async def script(sent: Sent) -> Any:
        return sse(first, then=[KeyError("bug")])

    router = make_router(tmp_path, script)
    observer = router.app.user_middleware[0]
    seen: list[Exchange] = []
    observe = router.deps.metrics.observe

    def keep(exchange: Exchange) -> str:
        seen.append(exchange)
        return observe(exchange)

    router.deps.metrics.observe = keep  # type: ignore[method-assign]
    assert observer.cls is RequestObserver  # type: ignore[comparison-overlap]
    payload = {"model": router.spec.entry.id, "messages": [], "stream": True}
    with caplog.at_level(logging.INFO):
        answer = asyncio.run(call(router.app, "/v1/chat/completions", payload))
    assert answer.status == 200 and answer.complete
    events = answer.events()
    assert events[0] == first
    assert "failed while relaying" in events[-1]["error"]["message"]
    assert [outcome_of(e) for e in seen] == ["router_error"]
    [failure] = errors(caplog)
    assert failure.getMessage() == "unexpected error while relaying a stream"


@pytest.mark.parametrize("failing", ["open_span", "begin"])
def test_a_failure_to_start_recording_a_request_is_one_500_with_its_id(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, failing: str
) -> None:
    router = answering_router(tmp_path)
    target = router.deps.telemetry if failing == "open_span" else router.deps.metrics
    break_method(target, failing, failing)
    body = json.dumps({"model": router.spec.entry.id, "messages": []}).encode()
    with caplog.at_level(logging.INFO):
        transport = serve_twice(router.app, request(b"/v1/chat/completions", body))
    assert statuses(transport) == [b"500", b"500"]
    wire = b"".join(transport.writes)
    ids = [i.decode() for i in re.findall(rb"x-request-id: (\w+)\r\n", wire)]
    failures = errors(caplog)
    assert [r.getMessage() for r in failures] == [f"request {i} failed unexpectedly" for i in ids]
    access = [r for r in caplog.records if r.name == "slm_server.access"]
    assert len(access) == 2
    assert_logged_once(caplog)
