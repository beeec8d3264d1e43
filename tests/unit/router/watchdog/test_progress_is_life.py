"""Progress is life: a stream to an engine that reports its prompt progress (native
llama-server) is asked for it, its reports keep the backend's silence timer from
tripping while a long prompt is read, they never reach a client that did not ask, and
silence anywhere in the stream (before the first byte, between tokens) trips the
watchdog within the silence limit.

Driven through the real code: the router in-process on a scripted upstream that plays
llama-server's chunks (the shapes of the pinned release's ``return_progress``), both
through plain ASGI and through the router's door.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from tests.unit.router.inprocess import (
    FakeResponse,
    Router,
    Sent,
    Step,
    backend_state,
    call,
    make_router,
    until,
)
from tests.unit.router.test_proxy import CHAT, MODEL, USAGE_CHUNK, chat, delta, serving

pytestmark = pytest.mark.usefixtures("via")

SILENCE = 0.25  # the silence limit the tests run with
STREAM = {"content-type": "text/event-stream"}


def run(scenario: Any) -> None:
    asyncio.run(asyncio.wait_for(scenario, 20))


def progress_chunk(processed: int, total: int = 2048) -> dict[str, Any]:
    """A prompt progress report as llama-server streams it on chat completions: a role
    delta with no content, and ``prompt_progress``."""
    return {
        "choices": [
            {"finish_reason": None, "index": 0, "delta": {"role": "assistant", "content": None}}
        ],
        "created": 1,
        "id": "chatcmpl-1",
        "model": MODEL,
        "system_fingerprint": "b1-0c1e570",
        "object": "chat.completion.chunk",
        "prompt_progress": {"total": total, "cache": 0, "processed": processed, "time_ms": 1.5},
    }


def first_token(text: str) -> dict[str, Any]:
    """The first token's chunk: llama-server opens it with the role again."""
    chunk = delta(text)
    chunk["choices"][0]["delta"] = {"role": "assistant", "content": text}
    return chunk


def event(data: Any) -> bytes:
    return b"data: " + (data if isinstance(data, bytes) else json.dumps(data).encode()) + b"\n\n"


def llama_router(
    tmp_path: Path,
    script: Any,
    *,
    timeout: float = 5.0,
    kind: str = "llama-server",
    more_env: dict[str, str] | None = None,
) -> Router:
    """A router whose one backend the launcher published as ``kind``, with the silence
    limit of these tests (or ``more_env``'s) and a first-byte stall limit far beyond
    them."""
    env = {
        "SLM_WATCHDOG_SILENCE_SECONDS": str(SILENCE),
        "SLM_WATCHDOG_STALL_SECONDS": "60",
        **(more_env or {}),
    }
    router = make_router(tmp_path, script, timeout=timeout, env=env)
    spec = router.spec
    router.states.states[(spec.role, spec.entry.port)] = backend_state(spec, "ready", kind=kind)
    router.states.alive = True
    return router


def playing(steps: Iterable[Step]) -> Any:
    """A backend that answers every request with a stream of ``steps``."""
    frozen = list(steps)

    async def script(_sent: Sent) -> FakeResponse:
        return FakeResponse(200, STREAM, list(frozen))

    return script


def stalls(router: Router) -> list[dict[str, Any]]:
    return [e for e in router.events.named("backend_failure") if e["reason"] == "stall"]


def paced(*gaps_and_steps: float | Step) -> list[Step]:
    """Steps with pauses: each number is a pause of that many seconds before the next
    step (an event the loop sets then: the backend's own pace, which is what the
    silence timer measures)."""
    loop = asyncio.get_running_loop()
    steps: list[Step] = []
    due = 0.0
    for item in gaps_and_steps:
        if isinstance(item, (int, float)):
            due += float(item)
            gate = asyncio.Event()
            loop.call_later(due, gate.set)
            steps.append(gate)
        else:
            steps.append(item)
    return steps


ANSWER_CHUNKS = [first_token("Hel"), delta("lo", "stop"), USAGE_CHUNK]


def test_the_router_asks_for_progress_and_keeps_the_reports_from_the_client(
    tmp_path: Path,
) -> None:
    steps = [event(progress_chunk(0)), event(progress_chunk(1024))]
    steps += [event(c) for c in ANSWER_CHUNKS] + [event(b"[DONE]")]
    router = llama_router(tmp_path, playing(steps))

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, CHAT, chat(stream=True))
            assert got.status == 200
            assert got.events() == [first_token("Hel"), delta("lo", "stop"), "[DONE]"]
            [sent] = router.transport.sent
            assert sent.json()["return_progress"] is True
            assert stalls(router) == []

    run(scenario())


def test_a_client_that_asked_for_progress_gets_the_reports(tmp_path: Path) -> None:
    steps = [event(progress_chunk(0))] + [event(c) for c in ANSWER_CHUNKS] + [event(b"[DONE]")]
    router = llama_router(tmp_path, playing(steps))

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, CHAT, chat(stream=True, return_progress=True))
            assert got.events() == [
                progress_chunk(0),
                first_token("Hel"),
                delta("lo", "stop"),
                "[DONE]",
            ]

    run(scenario())


def test_a_completions_stream_loses_its_progress_reports_too(tmp_path: Path) -> None:
    choice = {"text": "", "index": 0, "logprobs": None, "finish_reason": None}
    report = {
        "choices": [choice],
        "created": 1,
        "model": MODEL,
        "object": "text_completion",
        "id": "cmpl-1",
        "prompt_progress": {"total": 9, "cache": 0, "processed": 9, "time_ms": 2.0},
    }
    token = {**report, "choices": [{**choice, "text": "Hi"}]}
    del token["prompt_progress"]
    router = llama_router(tmp_path, playing([event(report), event(token), event(b"[DONE]")]))

    async def scenario() -> None:
        async with serving(router):
            body = {"model": MODEL, "prompt": "hi", "stream": True}
            got = await call(router.app, "/v1/completions", body)
            assert got.events() == [token, "[DONE]"]
            assert router.transport.sent[0].json()["return_progress"] is True

    run(scenario())


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/responses", {"model": MODEL, "input": "hi", "stream": True}),
        (
            "/v1/messages",
            {
                "model": MODEL,
                "max_tokens": 16,
                "stream": True,
                "messages": [{"role": "user", "content": "hi"}],
            },
        ),
    ],
    ids=["responses", "messages"],
)
def test_a_translated_stream_never_shows_the_reports(
    tmp_path: Path, path: str, body: dict[str, Any]
) -> None:
    with_reports = [event(progress_chunk(0)), event(progress_chunk(9, 9))]
    answer = [event(c) for c in ANSWER_CHUNKS] + [event(b"[DONE]")]
    router = llama_router(tmp_path, playing(with_reports + answer))
    (tmp_path / "plain").mkdir()
    plain = make_router(tmp_path / "plain", playing(answer))

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, path, body)
            assert router.transport.sent[0].json()["return_progress"] is True
        async with serving(plain):
            expected = await call(plain.app, path, body)
            assert "return_progress" not in plain.transport.sent[0].json()
        # The same events as without the reports (ids and times aside).
        assert _types(got.body) == _types(expected.body)
        assert b"prompt_progress" not in got.body

    run(scenario())


def _types(body: bytes) -> list[str]:
    return [line for line in body.decode().splitlines() if line.startswith("event:")] or [
        json.loads(line[6:]).get("type", "")
        for line in body.decode().splitlines()
        if line.startswith("data: {")
    ]


def test_reports_keep_a_long_prompt_alive_past_the_silence_limit(tmp_path: Path) -> None:
    """A prompt read for four times the silence limit, a report every 0.4 of it: never
    a stall, and the answer is the backend's."""

    async def script(_sent: Sent) -> FakeResponse:
        steps: list[float | Step] = [event(progress_chunk(0))]
        for n in range(1, 11):
            steps += [SILENCE * 0.4, event(progress_chunk(n * 200))]
        steps += [event(c) for c in ANSWER_CHUNKS] + [event(b"[DONE]")]
        return FakeResponse(200, STREAM, paced(*steps))

    router = llama_router(tmp_path, script)

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, CHAT, chat(stream=True))
            assert got.events() == [first_token("Hel"), delta("lo", "stop"), "[DONE]"]
            assert stalls(router) == []
            assert router.events.named("restart_requested") == []

    run(scenario())


def test_silence_between_tokens_trips_within_the_silence_limit(tmp_path: Path) -> None:
    """Tokens, then nothing: the stall is recorded once the silence passes the limit,
    long before the request's deadline; the stream goes on when the backend does."""
    resume = asyncio.Event()

    async def script(_sent: Sent) -> FakeResponse:
        steps: list[Step] = [event(progress_chunk(0)), event(first_token("Hel")), resume]
        steps += [event(delta("lo", "stop")), event(USAGE_CHUNK), event(b"[DONE]")]
        return FakeResponse(200, STREAM, steps)

    router = llama_router(tmp_path, script, timeout=10.0)

    async def scenario() -> None:
        async with serving(router):
            loop = asyncio.get_running_loop()
            started = loop.time()
            task = asyncio.ensure_future(call(router.app, CHAT, chat(stream=True)))
            await until(lambda: stalls(router), "a stall recorded")
            took = loop.time() - started
            assert SILENCE <= took < SILENCE + 1.0
            [stall] = stalls(router)
            assert stall["detail"] == (
                f"nothing from the backend for {SILENCE:g}s on a streaming request "
                "(no prompt progress, no token)"
            )
            assert len(router.events.named("restart_requested")) == 1
            resume.set()
            got = await task
            assert got.events() == [first_token("Hel"), delta("lo", "stop"), "[DONE]"]

    run(scenario())


def test_silence_before_anything_trips_within_the_silence_limit(tmp_path: Path) -> None:
    """No head at all (a frozen backend): the stall is recorded within the silence
    limit; a backend that then answers is relayed as ever."""
    thaw = asyncio.Event()

    async def script(_sent: Sent) -> FakeResponse:
        await thaw.wait()
        return FakeResponse(200, STREAM, [event(c) for c in ANSWER_CHUNKS] + [event(b"[DONE]")])

    router = llama_router(tmp_path, script, timeout=10.0)

    async def scenario() -> None:
        async with serving(router):
            loop = asyncio.get_running_loop()
            started = loop.time()
            task = asyncio.ensure_future(call(router.app, CHAT, chat(stream=True)))
            await until(lambda: stalls(router), "a stall recorded")
            assert loop.time() - started < SILENCE + 1.0
            thaw.set()
            got = await task
            assert got.events() == [first_token("Hel"), delta("lo", "stop"), "[DONE]"]

    run(scenario())


def test_an_engine_without_progress_keeps_the_first_byte_rule(tmp_path: Path) -> None:
    """The Python fallback reports no progress: it is not asked, and silence after the
    first byte is not timed (only the deadline judges it)."""
    resume = asyncio.Event()

    async def script(_sent: Sent) -> FakeResponse:
        steps: list[Step] = [event(first_token("Hel")), resume]
        steps += [event(delta("lo", "stop")), event(b"[DONE]")]
        return FakeResponse(200, STREAM, steps)

    router = llama_router(tmp_path, script, kind="llama_cpp.server")

    async def scenario() -> None:
        async with serving(router):
            loop = asyncio.get_running_loop()
            loop.call_later(SILENCE * 4, resume.set)
            got = await call(router.app, CHAT, chat(stream=True))
            assert got.events()[-1] == "[DONE]"
            assert "return_progress" not in router.transport.sent[0].json()
            assert stalls(router) == []

    run(scenario())


def test_reports_for_ever_are_bounded_by_the_deadline_not_counted(tmp_path: Path) -> None:
    """A backend that reports progress and never answers: the request ends at its
    deadline with nothing counted against the backend (it was making progress)."""

    async def script(_sent: Sent) -> FakeResponse:
        steps: list[float | Step] = []
        for n in range(40):
            steps += [SILENCE * 0.3, event(progress_chunk(n, 10_000))]
        return FakeResponse(200, STREAM, paced(*steps))

    router = llama_router(tmp_path, script, timeout=1.0)

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, CHAT, chat(stream=True))
            [error] = [e for e in got.events() if isinstance(e, dict) and "error" in e]
            assert error["error"]["code"] == "deadline_exceeded"
            assert b"prompt_progress" not in got.body
            assert router.events.named("backend_failure") == []
            [judged] = router.events.named("deadline_not_counted")
            assert judged["delivered"] is True
            assert judged["stall_seconds"] == SILENCE

    run(scenario())


# A request that does not stream, to llama-server: streamed and its answer gathered.

WHOLE = {
    "choices": [
        {"finish_reason": "stop", "index": 0, "message": {"role": "assistant", "content": "Hello"}}
    ],
    "created": 1,
    "id": "chatcmpl-1",
    "model": MODEL,
    "object": "chat.completion",
    "usage": USAGE_CHUNK["usage"],
}


def test_a_whole_answer_is_gathered_from_a_stream_with_reports(tmp_path: Path) -> None:
    """Reports for four times the silence limit, then the answer: never a stall, and
    the client gets one whole answer, as llama-server writes one."""

    async def script(_sent: Sent) -> FakeResponse:
        steps: list[float | Step] = [event(progress_chunk(0))]
        for n in range(1, 11):
            steps += [SILENCE * 0.4, event(progress_chunk(n * 200))]
        steps += [event(c) for c in ANSWER_CHUNKS] + [event(b"[DONE]")]
        return FakeResponse(200, STREAM, paced(*steps))

    router = llama_router(tmp_path, script)

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, CHAT, chat())
            assert got.status == 200
            assert got.headers["content-type"] == "application/json"
            assert got.json() == WHOLE
            assert got.body.startswith(b'{"choices":[{"finish_reason":"stop"')
            sent = router.transport.sent[0].json()
            assert sent["stream"] is True
            assert sent["return_progress"] is True
            assert sent["stream_options"] == {"include_usage": True}
            assert stalls(router) == []

    run(scenario())


def test_a_whole_answer_that_goes_silent_trips_within_the_silence_limit(tmp_path: Path) -> None:
    resume = asyncio.Event()

    async def script(_sent: Sent) -> FakeResponse:
        steps: list[Step] = [event(progress_chunk(0)), event(first_token("Hel")), resume]
        steps += [event(delta("lo", "stop")), event(USAGE_CHUNK), event(b"[DONE]")]
        return FakeResponse(200, STREAM, steps)

    router = llama_router(tmp_path, script, timeout=10.0)

    async def scenario() -> None:
        async with serving(router):
            loop = asyncio.get_running_loop()
            started = loop.time()
            task = asyncio.ensure_future(call(router.app, CHAT, chat()))
            await until(lambda: stalls(router), "a stall recorded")
            assert loop.time() - started < SILENCE + 1.0
            resume.set()
            assert (await task).json() == WHOLE

    run(scenario())


@pytest.mark.parametrize(
    ("extra", "gathered"),
    [
        ({}, True),
        ({"logprobs": True, "top_logprobs": 2}, False),
        ({"n": 2}, False),
        ({"n_probs": 3}, False),
    ],
    ids=["plain", "logprobs", "choices", "n_probs"],
)
def test_only_what_a_stream_carries_alike_is_gathered(
    tmp_path: Path, extra: dict[str, Any], gathered: bool
) -> None:
    async def script(sent: Sent) -> FakeResponse:
        if sent.json().get("stream"):
            return FakeResponse(200, STREAM, [event(c) for c in ANSWER_CHUNKS] + [event(b"[DONE]")])
        return FakeResponse(200, {"content-type": "application/json"}, [json.dumps(WHOLE).encode()])

    router = llama_router(tmp_path, script)

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, CHAT, chat(**extra))
            assert got.json() == WHOLE
            assert router.transport.sent[0].json().get("stream", False) is gathered

    run(scenario())


def test_an_in_band_error_is_the_whole_answer_s_error(tmp_path: Path) -> None:
    failure = {
        "error": {"code": 400, "message": "the prompt is too long", "type": "invalid_request_error"}
    }
    router = llama_router(tmp_path, playing([event(progress_chunk(0)), event(failure)]))

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, CHAT, chat())
            assert got.status == 400
            assert got.json()["error"]["message"] == "the prompt is too long"

    run(scenario())


def test_a_translated_whole_answer_is_gathered_too(tmp_path: Path) -> None:
    steps = [event(progress_chunk(0))] + [event(c) for c in ANSWER_CHUNKS] + [event(b"[DONE]")]
    router = llama_router(tmp_path, playing(steps))
    body = {"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, "/v1/messages", body)
            assert got.status == 200
            message = got.json()
            assert message["type"] == "message"
            assert message["content"] == [{"type": "text", "text": "Hello"}]
            assert message["usage"]["output_tokens"] == 2
            sent = router.transport.sent[0].json()
            assert sent["stream"] is True and sent["return_progress"] is True

    run(scenario())
