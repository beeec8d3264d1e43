"""The Messages API in-process: what the backend is sent, what the client gets (strictly of
the anthropic SDK's types), Anthropic-shaped errors, keys in ``x-api-key``, token counts,
and that nothing a client sends here counts against a backend."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from slm_server.router.apis.table import TABLE
from slm_server.router.call.exchange import Exchange
from tests.anthropic_shapes import (
    sse_events,
    strict_count,
    strict_error,
    strict_events,
    strict_message,
)
from tests.unit.router.inprocess import (
    FakeResponse,
    Sent,
    call,
    entry_text,
    held_until,
    make_router,
    run,
    serving,
    sse,
    whole,
)

# Every test here runs twice: through plain ASGI and through the door (its fast path).
pytestmark = pytest.mark.usefixtures("via")

MESSAGES = "/v1/messages"
COUNT = "/v1/messages/count_tokens"
MODEL = "org/chat-model"
HEADERS = {"anthropic-version": "2023-06-01", "anthropic-beta": "interleaved-thinking-2025-05-14"}
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
    "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11},
}
MORE = entry_text(
    "mlx",
    18003,
    id="org/mlx-model",
    backend="mlx",
    model_path="mlx-community/some-model",
    quantization="4bit",
) + entry_text("embed", 18004, id="org/embed-model", model_type="embeddings")


def request(stream: bool = False, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "max_tokens": 16,
        "messages": [{"role": "user", "content": "hi"}],
        **({"stream": True} if stream else {}),
        **extra,
    }


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "object": "chat.completion.chunk",
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


USAGE = {
    "object": "chat.completion.chunk",
    "choices": [],
    "usage": {"prompt_tokens": 9, "completion_tokens": 2},
}


def answering(make: Any) -> Any:
    async def script(_sent: Sent) -> FakeResponse:
        response: FakeResponse = make()
        return response

    return script


def test_a_whole_answer_is_translated_both_ways(tmp_path: Path) -> None:
    router = make_router(tmp_path, answering(lambda: whole(ANSWER)))

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, MESSAGES, request(system="Be brief."), headers=HEADERS)
            assert got.status == 200, got.body
            message = strict_message(got.json())
            assert message.content[0].text == "Hello there"  # type: ignore[union-attr]
            assert message.model == MODEL and message.stop_reason == "end_turn"
            assert message.usage.input_tokens == 9 and message.usage.output_tokens == 2
            [sent] = router.transport.sent
            assert sent.path == "/v1/chat/completions"
            assert sent.json() == {
                "model": MODEL,
                "max_tokens": 16,
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "hi"},
                ],
            }
            assert sent.headers["anthropic-version"] == "2023-06-01"  # tolerated, passed on
            assert router.gate_active() == 0

    run(scenario())


def test_a_stream_is_translated_event_by_event(tmp_path: Path) -> None:
    chunks = [
        chunk({"role": "assistant", "content": "Hel"}),
        chunk({"content": "lo"}, "stop"),
        USAGE,
    ]
    router = make_router(tmp_path, answering(lambda: sse(*chunks)))

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, MESSAGES, request(stream=True), headers=HEADERS)
            assert got.status == 200 and got.headers["content-type"] == "text/event-stream"
            events = sse_events(got.body)
            strict_events([data for _, data in events])
            texts = [d["delta"]["text"] for n, d in events if n == "content_block_delta"]
            assert texts == ["Hel", "lo"]
            assert events[-2][1]["usage"]["output_tokens"] == 2
            sent = router.transport.sent[0].json()
            assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}
            assert router.gate_active() == 0

    run(scenario())


def test_a_deadline_that_cuts_a_stream_ends_it_with_an_error_event(tmp_path: Path) -> None:
    never = asyncio.Event()
    router = make_router(
        tmp_path,
        answering(lambda: sse(chunk({"content": "Hi"}), done=False, then=[never])),
        timeout=0.3,
    )

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, MESSAGES, request(stream=True))
            assert got.status == 200 and got.complete
            events = sse_events(got.body)
            strict_events([data for _, data in events], ends="error")
            error = strict_error(events[-1][1], "timeout_error")
            assert "deadline" in error.error.message
            assert router.transport.responses[0].closed.is_set()
            assert router.gate_active() == 0

    run(scenario())


def test_a_backend_error_mid_stream_ends_it_with_an_error_event(tmp_path: Path) -> None:
    broken = {"error": {"code": 500, "message": "decode failed", "type": "server_error"}}
    router = make_router(tmp_path, answering(lambda: sse(chunk({"content": "Hi"}), broken)))

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, MESSAGES, request(stream=True))
            events = sse_events(got.body)
            strict_events([data for _, data in events], ends="error")
            assert strict_error(events[-1][1], "api_error").error.message == "decode failed"

    run(scenario())


def test_a_backend_error_status_takes_anthropics_shape(tmp_path: Path) -> None:
    too_long = {"error": {"code": 400, "message": "the request exceeds the context", "type": "x"}}
    router = make_router(tmp_path, answering(lambda: whole(too_long, status=400)))

    async def scenario() -> None:
        async with serving(router):
            for stream in (False, True):
                got = await call(router.app, MESSAGES, request(stream=stream))
                assert got.status == 400
                error = strict_error(got.json(), "invalid_request_error")
                assert error.error.message == "the request exceeds the context"
            assert router.events.events == []

    run(scenario())


@pytest.mark.parametrize(
    ("body", "status", "kind"),
    [
        (b"{not json", 400, "invalid_request_error"),
        (json.dumps({**request(), "model": "nope"}).encode(), 404, "not_found_error"),
        (
            json.dumps(request(max_tokens=0)).encode(),
            400,
            "invalid_request_error",
        ),
        (
            json.dumps(request(messages=[{"role": "tool", "content": "x"}])).encode(),
            400,
            "invalid_request_error",
        ),
        (
            json.dumps({**request(), "model": "org/embed-model"}).encode(),
            400,
            "invalid_request_error",
        ),
        (
            json.dumps(
                request(
                    messages=[
                        {
                            "role": "user",
                            "content": [
                                {
                                    "type": "image",
                                    "source": {"type": "url", "url": "https://x/y.png"},
                                }
                            ],
                        }
                    ]
                )
            ).encode(),
            400,
            "invalid_request_error",
        ),
    ],
)
def test_what_the_client_gets_wrong_is_refused_in_anthropics_shape_and_never_sent(
    tmp_path: Path, body: bytes, status: int, kind: str
) -> None:
    router = make_router(tmp_path, answering(lambda: whole(ANSWER)), more=MORE)

    async def scenario() -> None:
        async with serving(router):
            for path in (MESSAGES, COUNT):
                got = await call(router.app, path, body, headers=HEADERS)
                assert got.status == status, got.body
                strict_error(got.json(), kind)
            assert router.transport.sent == []
            assert router.events.events == []

    run(scenario())


def test_a_thinking_budget_is_checked_as_anthropic_does_and_the_cap_still_binds(
    tmp_path: Path,
) -> None:
    capped = "    preset: {max_output_tokens: 256}\n"
    router = make_router(tmp_path, answering(lambda: whole(ANSWER)), chat=capped)
    # What Claude Code sent before adaptive thinking: a budget past the cap it will meet.
    claude_code = request(max_tokens=32000, thinking={"type": "enabled", "budget_tokens": 31999})
    small = request(max_tokens=32000, thinking={"type": "enabled", "budget_tokens": 512})

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, MESSAGES, claude_code, headers=HEADERS)
            assert got.status == 200, got.body
            strict_message(got.json())
            [sent] = router.transport.sent
            body = sent.json()
            assert (body["max_tokens"], body["chat_template_kwargs"]) == (
                256,
                {"enable_thinking": True},
            )
            assert "thinking" not in body
            refused = await call(router.app, MESSAGES, small, headers=HEADERS)
            assert refused.status == 400
            error = strict_error(refused.json(), "invalid_request_error")
            assert "`thinking.budget_tokens` must be at least 1024" in error.error.message
            assert len(router.transport.sent) == 1

    run(scenario())


def test_unknown_paths_and_methods_take_anthropics_shape(tmp_path: Path) -> None:
    router = make_router(tmp_path, answering(lambda: whole(ANSWER)))

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, MESSAGES, b"", method="GET")
            assert got.status == 405
            strict_error(got.json(), "invalid_request_error")
            got = await call(router.app, "/v1/messages/batches", request())
            assert got.status == 404
            strict_error(got.json(), "not_found_error")
            got = await call(router.app, "/v1/nope", request())
            assert got.status == 404 and "error" in got.json() and "type" not in got.json()

    run(scenario())


def test_a_full_queue_is_a_rate_limit_error_with_retry_after(tmp_path: Path) -> None:
    release = asyncio.Event()
    router = make_router(tmp_path, held_until(release, ANSWER), concurrency=1, queue=0)

    async def scenario() -> None:
        async with serving(router):
            first = asyncio.ensure_future(call(router.app, MESSAGES, request()))
            while router.gate_active() == 0:
                await asyncio.sleep(0.001)
            got = await call(router.app, MESSAGES, request(stream=True))
            assert got.status == 429 and got.headers["retry-after"] == "1"
            assert "queue_full" in strict_error(got.json(), "rate_limit_error").error.message
            release.set()
            assert (await first).status == 200
            assert router.events.events == []

    run(scenario())


def test_keys_are_taken_from_x_api_key_or_bearer_on_every_route(tmp_path: Path) -> None:
    router = make_router(tmp_path, answering(lambda: whole(ANSWER)), env={"SLM_API_KEYS": "secret"})

    async def scenario() -> None:
        async with serving(router):
            for headers in ({}, {"x-api-key": "wrong"}, {"authorization": "Bearer wrong"}):
                got = await call(router.app, MESSAGES, request(), headers=headers)
                assert got.status == 401
                strict_error(got.json(), "authentication_error")
                got = await call(router.app, "/v1/chat/completions", request(), headers=headers)
                assert got.status == 401 and got.json()["error"]["code"] == "invalid_api_key"
            for headers in ({"x-api-key": "secret"}, {"authorization": "Bearer secret"}):
                assert (await call(router.app, MESSAGES, request(), headers=headers)).status == 200
                got = await call(router.app, "/v1/models", b"", method="GET", headers=headers)
                assert got.status == 200
            both = {"authorization": "Bearer wrong", "x-api-key": "secret"}
            assert (await call(router.app, MESSAGES, request(), headers=both)).status == 200
            assert all("x-api-key" not in sent.headers for sent in router.transport.sent)

    run(scenario())


def test_count_tokens_asks_llama_server_and_estimates_elsewhere(tmp_path: Path) -> None:
    async def script(sent: Sent) -> FakeResponse:
        if sent.spec.entry.id == MODEL and sent.path == COUNT:
            return whole({"input_tokens": 42})
        return whole({"error": "not found"}, status=404)

    router = make_router(tmp_path, script, more=MORE)

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, COUNT, request(), headers=HEADERS)
            assert got.status == 200 and strict_count(got.json()).input_tokens == 42
            [sent] = router.transport.sent
            assert sent.path == COUNT and sent.json() == request()
            mlx = {**request(), "model": "org/mlx-model", "system": "x" * 400}
            got = await call(router.app, COUNT, mlx)
            assert strict_count(got.json()).input_tokens == 100 + 2 * 4 + 1
            assert len(router.transport.sent) == 1  # estimated without asking
            assert router.gate_active() == 0

    run(scenario())


def test_count_tokens_estimates_when_the_backend_has_no_route(tmp_path: Path) -> None:
    router = make_router(tmp_path, answering(lambda: whole({"error": "no"}, status=404)))

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, COUNT, request())
            assert got.status == 200 and strict_count(got.json()).input_tokens == 1 + 4
            assert router.transport.responses[0].closed.is_set()
            assert router.gate_active() == 0 and router.events.events == []

    run(scenario())


def test_the_route_has_its_own_emit_path() -> None:
    assert Exchange("r", "POST", MESSAGES, shape=TABLE.at(MESSAGES)).emit_path == "messages"
    assert Exchange("r", "POST", COUNT, shape=TABLE.at(COUNT)).emit_path == "count_tokens"
    streamed = Exchange("r", "POST", MESSAGES, shape=TABLE.at(MESSAGES))
    streamed.note_request({"stream": True, "max_tokens": 5})
    assert streamed.stream and streamed.emit_path == "messages" and streamed.max_tokens == 5
