"""The proxy in-process: ``create_app`` with a scripted upstream transport, no process
started and no socket opened. What the backend is sent, what the client gets, what the
watchdog hears, and that every admission slot and upstream response is given back
whatever ends the request."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import pytest

from slm_server.contracts.records import BackendState
from slm_server.errors import BackendUnavailable
from tests.openai_shapes import strict_events, strict_response
from tests.unit.router.inprocess import (
    Answer,
    FakeResponse,
    Router,
    Sent,
    call,
    held_until,
    make_router,
    run,
    sse,
    whole,
)

# Every test here runs twice: through plain ASGI and through the door (its fast path).
pytestmark = pytest.mark.usefixtures("via")

CHAT = "/v1/chat/completions"
MODEL = "org/chat-model"
ANSWER = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": MODEL,
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hello there"},
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
}


def chat(stream: bool = False, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "stream": stream,
        **extra,
    }


def delta(text: str, finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": MODEL,
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}],
    }


USAGE_CHUNK = {
    "id": "chatcmpl-1",
    "object": "chat.completion.chunk",
    "created": 1,
    "model": MODEL,
    "choices": [],
    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
}


def answering(response: Callable[[], FakeResponse]) -> Callable[[Sent], Awaitable[FakeResponse]]:
    async def script(_sent: Sent) -> FakeResponse:
        return response()

    return script


@asynccontextmanager
async def serving(router: Router) -> AsyncIterator[Router]:
    """The app's lifespan around a test (telemetry, drain, closing the transport)."""
    async with router.app.router.lifespan_context(router.app):
        yield router
    assert router.transport.closed


def test_a_whole_answer_passes_through_and_the_backend_gets_a_clean_request(
    tmp_path: Path,
) -> None:
    router = make_router(tmp_path, answering(lambda: whole(ANSWER)))

    async def scenario() -> None:
        async with serving(router):
            got = await call(
                router.app,
                CHAT,
                chat(),
                headers={
                    "authorization": "Bearer client-secret",
                    "connection": "keep-alive, x-hop",
                    "x-hop": "dropped",
                    "x-kept": "kept",
                    "x-request-id": "abc-123",
                },
            )
            assert got.status == 200
            assert got.json() == ANSWER
            [sent] = router.transport.sent
            assert sent.path == CHAT
            assert sent.json()["messages"] == [{"role": "user", "content": "hi"}]
            assert sent.headers["x-request-id"] == "abc-123"
            assert sent.headers["x-kept"] == "kept"
            for dropped in ("authorization", "connection", "x-hop", "host", "content-length"):
                assert dropped not in sent.headers
            assert router.transport.responses[0].closed.is_set()
            assert router.gate_active() == 0

    run(scenario())


def test_a_backend_error_is_openai_shaped_and_counted_by_the_watchdog(tmp_path: Path) -> None:
    backend_error = {"error": {"code": 500, "message": "boom", "type": "server_error"}}
    router = make_router(tmp_path, answering(lambda: whole(backend_error, status=500)))

    async def scenario() -> None:
        async with serving(router):
            for _ in range(2):  # the failure threshold in make_router
                got = await call(router.app, CHAT, chat())
                assert got.status == 500
                assert got.json() == {
                    "error": {
                        "code": "500",
                        "message": "boom",
                        "type": "server_error",
                        "param": None,
                    }
                }
            [requested] = router.events.named("restart_requested")
            assert requested["model_id"] == MODEL
            assert requested["reason"] == "5xx"
            assert router.gate_active() == 0

    run(scenario())


def test_a_client_error_is_passed_on_and_never_counted(tmp_path: Path) -> None:
    refused = {"error": {"code": 400, "message": "bad grammar", "type": "invalid_request_error"}}
    router = make_router(tmp_path, answering(lambda: whole(refused, status=400)))

    async def scenario() -> None:
        async with serving(router):
            for _ in range(4):
                got = await call(router.app, CHAT, chat())
                assert got.status == 400
                assert got.json()["error"]["code"] == "400"
            assert router.events.named("restart_requested") == []
            assert router.events.named("backend_failure") == []

    run(scenario())


def test_a_stream_is_relayed_and_the_usage_chunk_the_router_asked_for_is_kept_back(
    tmp_path: Path,
) -> None:
    chunks = [delta("Hel"), delta("lo", "stop"), USAGE_CHUNK]
    router = make_router(tmp_path, answering(lambda: sse(*chunks)))

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, CHAT, chat(stream=True))
            assert got.status == 200
            assert got.headers["content-type"].startswith("text/event-stream")
            assert got.events() == [delta("Hel"), delta("lo", "stop"), "[DONE]"]
            [sent] = router.transport.sent
            assert sent.json()["stream_options"] == {"include_usage": True}
            assert router.transport.responses[0].closed.is_set()
            assert router.gate_active() == 0

    run(scenario())


def test_a_client_that_asked_for_usage_gets_it(tmp_path: Path) -> None:
    router = make_router(tmp_path, answering(lambda: sse(delta("Hi", "stop"), USAGE_CHUNK)))

    async def scenario() -> None:
        async with serving(router):
            asked = chat(stream=True, stream_options={"include_usage": True})
            got = await call(router.app, CHAT, asked)
            assert got.events() == [delta("Hi", "stop"), USAGE_CHUNK, "[DONE]"]

    run(scenario())


def test_a_stream_is_relayed_as_it_arrives_not_when_it_ends(tmp_path: Path) -> None:
    more = asyncio.Event()
    router = make_router(
        tmp_path, answering(lambda: sse(delta("one"), then=[more, b"data: {}\n\n"]))
    )

    async def scenario() -> None:
        async with serving(router):
            answer = Answer()
            task = asyncio.ensure_future(call(router.app, CHAT, chat(stream=True), answer=answer))
            while not answer.chunks:  # the first event is out while the backend waits
                await asyncio.sleep(0.001)
            assert answer.events() == [delta("one")]
            assert not answer.complete
            more.set()
            got = await task
            assert got.complete
            assert got.events()[-1] == "[DONE]"

    run(scenario())


def test_the_models_own_deadline_cuts_a_silent_backend_and_the_watchdog_judges_it(
    tmp_path: Path,
) -> None:
    never = asyncio.Event()
    router = make_router(
        tmp_path,
        answering(lambda: FakeResponse(200, {"content-type": "application/json"}, [never])),
        timeout=0.3,
    )

    async def scenario() -> None:
        async with serving(router):
            loop = asyncio.get_running_loop()
            started = loop.time()
            got = await call(router.app, CHAT, chat())
            took = loop.time() - started
            assert got.status == 504
            assert got.json()["error"]["code"] == "deadline_exceeded"
            assert 0.3 <= took < 1.0
            # Nothing delivered for the whole deadline: a timeout against the backend.
            [failure] = router.events.named("backend_failure")
            assert failure["reason"] == "timeout"
            assert "deadline of 0.3s" in failure["detail"]
            assert router.transport.responses[0].closed.is_set()
            assert router.gate_active() == 0

    run(scenario())


def test_a_deadline_the_client_shortened_is_never_judged(tmp_path: Path) -> None:
    never = asyncio.Event()
    router = make_router(
        tmp_path,
        answering(lambda: FakeResponse(200, {"content-type": "application/json"}, [never])),
    )

    async def scenario() -> None:
        async with serving(router):
            for _ in range(3):
                got = await call(router.app, CHAT, chat(), headers={"x-request-timeout": "0.1"})
                assert got.status == 504
            assert router.events.events == []
            assert router.gate_active() == 0

    run(scenario())


def test_a_client_that_leaves_mid_stream_frees_the_backend_and_its_slot(tmp_path: Path) -> None:
    never = asyncio.Event()
    router = make_router(tmp_path, answering(lambda: sse(delta("one"), then=[never])))

    async def scenario() -> None:
        async with serving(router):
            leave = asyncio.Event()
            answer = Answer()
            task = asyncio.ensure_future(
                call(router.app, CHAT, chat(stream=True), leave=leave, answer=answer)
            )
            while not answer.chunks:
                await asyncio.sleep(0.001)
            leave.set()
            await task
            await asyncio.wait_for(router.transport.responses[0].closed.wait(), 2)
            assert router.gate_active() == 0
            assert router.events.named("backend_failure") == []

    run(scenario())


def test_a_client_that_leaves_before_its_stream_is_read_never_counts_as_a_stall(
    tmp_path: Path,
) -> None:
    """The client leaves while the stream's head is going out (its socket full), before
    the relay reads anything: the backend's first-byte timer is cancelled with the
    stream, so the backend (which had no chance to answer) is not blamed for a stall."""
    stall = 0.1
    never = asyncio.Event()
    router = make_router(
        tmp_path,
        answering(lambda: sse(then=[never])),
        env={"SLM_WATCHDOG_STALL_SECONDS": str(stall)},
    )
    leave, at_head = asyncio.Event(), asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        async def held_send(message: Any) -> None:
            if message["type"] == "http.response.start":
                at_head.set()
                await never.wait()  # a client that reads nothing: ended by the cut
            await send(message)

        await router.app(scope, receive, held_send)

    async def scenario() -> None:
        async with serving(router):
            loop = asyncio.get_running_loop()
            task = asyncio.ensure_future(call(cast(Any, app), CHAT, chat(stream=True), leave=leave))
            await asyncio.wait_for(at_head.wait(), 2)
            leave.set()
            await task
            await asyncio.wait_for(router.transport.responses[0].closed.wait(), 2)
            # A timer armed now fires after the stall timer would have (same delay, set
            # later): by then a stall would have been heard.
            passed = asyncio.Event()
            loop.call_later(stall, passed.set)
            await passed.wait()
            assert router.events.named("backend_failure") == []
            assert router.gate_active() == 0

    run(scenario())


def test_a_client_that_leaves_while_queued_gives_up_its_place(tmp_path: Path) -> None:
    release = asyncio.Event()
    slow = held_until(release, ANSWER)
    router = make_router(tmp_path, slow, concurrency=1, queue=2)

    async def scenario() -> None:
        async with serving(router):
            gate = router.deps.gates[router.spec.role]
            first = asyncio.ensure_future(call(router.app, CHAT, chat()))
            while gate.active == 0:
                await asyncio.sleep(0.001)
            leave = asyncio.Event()
            queued = asyncio.ensure_future(call(router.app, CHAT, chat(), leave=leave))
            while gate.queued == 0:
                await asyncio.sleep(0.001)
            leave.set()
            await queued
            assert gate.queued == 0
            release.set()
            assert (await first).status == 200
            assert len(router.transport.sent) == 1  # the one that left was never sent
            assert gate.active == 0

    run(scenario())


def test_a_full_queue_is_refused_with_retry_after(tmp_path: Path) -> None:
    release = asyncio.Event()
    slow = held_until(release, ANSWER)
    router = make_router(tmp_path, slow, concurrency=1, queue=0)

    async def scenario() -> None:
        async with serving(router):
            first = asyncio.ensure_future(call(router.app, CHAT, chat()))
            while router.gate_active() == 0:
                await asyncio.sleep(0.001)
            got = await call(router.app, CHAT, chat())
            assert got.status == 429
            assert "retry-after" in got.headers
            release.set()
            assert (await first).status == 200
            assert router.events.events == []

    run(scenario())


def published(router: Router, state: str, reason: str | None = None) -> BackendState:
    """The state a running launcher publishes for the router's one backend."""
    spec = router.spec
    return BackendState(
        role=spec.role,
        model_id=spec.entry.id,
        backend="llamacpp",
        port=spec.entry.port,
        state=state,
        pid=None,
        since=0.0,
        started_at=None,
        exit_status=None,
        restarts=1,
        reason=reason,
        log_path="logs/chat.log",
    )


def test_a_restarting_backend_is_refused_without_sending(tmp_path: Path) -> None:
    router = make_router(tmp_path, answering(lambda: whole(ANSWER)))
    spec = router.spec
    router.states.alive = True
    router.states.states[(spec.role, spec.entry.port)] = published(router, "restarting", "stalled")

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, CHAT, chat())
            assert got.status == 503
            assert got.json()["error"]["code"] == "backend_restarting"
            assert "retry-after" in got.headers
            assert router.transport.sent == []

    run(scenario())


def test_a_backend_just_published_ready_is_not_refused_on_an_older_view(
    tmp_path: Path,
) -> None:
    """The router stats the state file at most every 20 ms: a request that its older
    view would refuse as restarting is decided again on the file as it is now."""
    router = make_router(tmp_path, answering(lambda: whole(ANSWER)))
    spec = router.spec
    router.states.alive = True
    key = (spec.role, spec.entry.port)
    router.states.states[key] = published(router, "ready")
    router.states.stale = {key: published(router, "restarting", "stalled")}

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, CHAT, chat())
            assert got.status == 200, got.body
            assert len(router.transport.sent) == 1

    run(scenario())


def test_an_unreachable_backend_is_503_and_counted(tmp_path: Path) -> None:
    async def refused(_sent: Sent) -> FakeResponse:
        raise BackendUnavailable("The backend is unreachable", retry_after=5.0)

    router = make_router(tmp_path, refused)

    async def scenario() -> None:
        async with serving(router):
            for _ in range(2):
                got = await call(router.app, CHAT, chat())
                assert got.status == 503
            assert len(router.events.named("restart_requested")) == 1
            assert router.gate_active() == 0

    run(scenario())


def test_an_answer_past_the_cap_is_502_and_never_counted(tmp_path: Path) -> None:
    huge = FakeResponse(200, {"content-type": "application/json"}, [b"x" * 600_000] * 4)
    router = make_router(tmp_path, answering(lambda: huge), env={"SLM_MAX_ANSWER_MB": "1"})

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, CHAT, chat())
            assert got.status == 502
            assert got.json()["error"]["code"] == "upstream_too_large"
            assert huge.closed.is_set()
            assert router.gate_active() == 0
            assert router.events.named("backend_failure") == []

    run(scenario())


def test_the_responses_api_is_translated_to_chat_for_llama_cpp(tmp_path: Path) -> None:
    router = make_router(tmp_path, answering(lambda: whole(ANSWER)))

    async def scenario() -> None:
        async with serving(router):
            got = await call(
                router.app,
                "/v1/responses",
                {"model": MODEL, "input": "hi", "max_output_tokens": 16},
            )
            assert got.status == 200
            response = strict_response(got.json())
            assert response.output_text == "Hello there"
            assert response.status == "completed"
            [sent] = router.transport.sent
            assert sent.path == CHAT
            assert sent.json()["messages"][-1] == {"role": "user", "content": "hi"}

    run(scenario())


def test_a_responses_stream_is_translated_event_by_event(tmp_path: Path) -> None:
    chunks = [delta("Hel"), delta("lo", "length"), USAGE_CHUNK]
    router = make_router(tmp_path, answering(lambda: sse(*chunks)))

    async def scenario() -> None:
        async with serving(router):
            asked = {"model": MODEL, "input": "hi", "stream": True, "max_output_tokens": 2}
            got = await call(router.app, "/v1/responses", asked)
            assert got.status == 200
            events = strict_events(got.events())
            assert events[-1].type == "response.incomplete"
            text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
            assert text == "Hello"

    run(scenario())


@pytest.mark.parametrize(
    ("body", "content_type", "status"),
    [
        (b"{not json", "application/json", 400),
        (b'{"model": "org/chat-model"}', "text/plain", 415),
        (b'{"model": "nobody", "messages": []}', "application/json", 404),
    ],
)
def test_bad_requests_are_refused_before_anything_is_sent(
    tmp_path: Path, body: bytes, content_type: str, status: int
) -> None:
    router = make_router(tmp_path, answering(lambda: whole(ANSWER)))

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, CHAT, body, headers={"content-type": content_type})
            assert got.status == status
            assert set(got.json()["error"]) == {"message", "type", "param", "code"}
            assert router.transport.sent == []
            assert router.gate_active() == 0

    run(scenario())


IMAGE_URL = "data:image/png;base64,AAAA"


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (
            CHAT,
            chat(
                messages=[
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "Hello"},
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "And this?"},
                            {"type": "image_url", "image_url": {"url": IMAGE_URL}},
                        ],
                    },
                ]
            ),
            "messages[2].content[1]",
        ),
        (
            "/v1/responses",
            {
                "model": MODEL,
                "input": [
                    {"role": "user", "content": [{"type": "input_image", "image_url": IMAGE_URL}]}
                ],
            },
            "input[0].content[0]",
        ),
    ],
)
def test_an_image_for_a_text_only_model_is_400_before_anything_is_sent(
    tmp_path: Path, path: str, body: dict[str, Any], param: str
) -> None:
    router = make_router(tmp_path, answering(lambda: whole(ANSWER)))

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, path, body)
            assert got.status == 400
            error = got.json()["error"]
            assert (error["type"], error["param"]) == ("invalid_request_error", param)
            assert router.transport.sent == []
            assert router.gate_active() == 0
            assert router.events.named("backend_failure") == []

    run(scenario())
