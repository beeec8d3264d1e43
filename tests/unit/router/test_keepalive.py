"""No silent waits: a streamed request's client is sent a keep-alive each
``SLM_KEEPALIVE_SECONDS`` it waits with nothing sent — in the admission queue, while
the engine reads the prompt (its progress reports hidden), before a translated
answer's first token — in its API shape's own way (an SSE comment; Messages' ``ping``),
with its progress where it asked (``X-SLM-Progress``). What comes after the head went
out early is told in band; a request that never waits, and one that does not stream,
get exactly what they got before.

Driven through the real code, in-process, through plain ASGI and through the door.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.unit.router.inprocess import (
    Answer,
    FakeResponse,
    Router,
    Sent,
    Step,
    call,
    make_router,
    until,
    whole,
)
from tests.unit.router.test_proxy import ANSWER, CHAT, MODEL, chat, delta, serving
from tests.unit.router.watchdog.test_progress_is_life import (
    ANSWER_CHUNKS,
    STREAM,
    event,
    first_token,
    llama_router,
    paced,
    progress_chunk,
)

pytestmark = pytest.mark.usefixtures("via")

BEAT = 0.1  # the keep-alive interval the tests run with
KEEPALIVE = {"SLM_KEEPALIVE_SECONDS": str(BEAT)}
COMMENT = b": keep-alive\n\n"
JSON = {"content-type": "application/json"}
PING = b'event: ping\ndata: {"type": "ping"}\n\n'
MESSAGES_BODY = {
    "model": MODEL,
    "max_tokens": 16,
    "stream": True,
    "messages": [{"role": "user", "content": "hi"}],
}


def run(scenario: Any) -> None:
    asyncio.run(asyncio.wait_for(scenario, 20))


class Stamped(list[bytes]):
    """The pieces a client received, each with when it came."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    def append(self, piece: bytes) -> None:
        self.times.append(time.monotonic())
        super().append(piece)


def stamped() -> Answer:
    answer = Answer()
    answer.chunks = Stamped()
    return answer


def longest_gap(answer: Answer, since: float) -> float:
    """The longest the client went without bytes, from ``since`` to its last piece."""
    chunks = answer.chunks
    assert isinstance(chunks, Stamped)
    times = [since, *chunks.times]
    return max(b - a for a, b in itertools.pairwise(times))


def streamed(*steps: Step) -> FakeResponse:
    return FakeResponse(200, STREAM, list(steps))


ANSWER_EVENTS = [event(c) for c in ANSWER_CHUNKS] + [event(b"[DONE]")]


def queued_router(tmp_path: Path, release: asyncio.Event, *, timeout: float = 5.0) -> Router:
    """One slot: the first request holds it until ``release``; the others stream."""

    async def script(sent: Sent) -> FakeResponse:
        if not sent.json().get("stream"):
            await release.wait()
            return whole(ANSWER)
        return streamed(*ANSWER_EVENTS)

    return make_router(tmp_path, script, concurrency=1, timeout=timeout, env=KEEPALIVE)


async def holding(router: Router, release: asyncio.Event) -> asyncio.Task[Answer]:
    """A request that holds the one slot until ``release``, in flight."""
    holder = asyncio.ensure_future(call(router.app, CHAT, chat()))
    await until(lambda: len(router.transport.sent) == 1, "the holder sent")
    return holder


def test_a_stream_waiting_in_the_queue_hears_a_beat_each_interval_then_its_answer(
    tmp_path: Path,
) -> None:
    release = asyncio.Event()
    router = queued_router(tmp_path, release)

    async def scenario() -> None:
        async with serving(router):
            holder = await holding(router, release)
            answer = stamped()
            began = time.monotonic()
            waiting = asyncio.ensure_future(
                call(router.app, CHAT, chat(stream=True), answer=answer)
            )
            await until(lambda: answer.body.count(COMMENT) >= 4, "four beats")
            assert answer.status == 200
            assert answer.headers["content-type"].startswith("text/event-stream")
            release.set()
            got = await waiting
            assert (await holder).json() == ANSWER
            assert got.events() == [first_token("Hel"), delta("lo", "stop"), "[DONE]"]
            assert got.body.startswith(COMMENT)
            assert longest_gap(got, began) < BEAT * 4  # never silent for long

    run(scenario())


def test_progress_asked_for_tells_the_place_in_the_queue(tmp_path: Path) -> None:
    release = asyncio.Event()
    router = queued_router(tmp_path, release)

    async def scenario() -> None:
        async with serving(router):
            holder = await holding(router, release)
            answer = Answer()
            waiting = asyncio.ensure_future(
                call(
                    router.app,
                    CHAT,
                    chat(stream=True),
                    answer=answer,
                    headers={"x-slm-progress": "1"},
                )
            )
            await until(lambda: b": slm-progress " in answer.body, "a progress line")
            release.set()
            got = await waiting
            await holder
            lines = [
                json.loads(line[len(": slm-progress ") :])
                for line in got.body.decode().splitlines()
                if line.startswith(": slm-progress ")
            ]
            assert lines[0]["stage"] == "queued"
            assert lines[0]["ahead"] == 0
            assert lines[0]["waited_seconds"] >= BEAT * 0.9
            assert got.events() == [first_token("Hel"), delta("lo", "stop"), "[DONE]"]

    run(scenario())


def test_a_prompt_read_with_hidden_reports_is_kept_alive_and_its_progress_told(
    tmp_path: Path,
) -> None:
    """Reports a little slower than the beat: the client hears a beat in between,
    never the reports, and (asking) the tokens read of the total."""

    async def script(_sent: Sent) -> FakeResponse:
        steps: list[float | Step] = [event(progress_chunk(0, 900))]
        for n in range(1, 4):
            steps += [BEAT * 1.6, event(progress_chunk(n * 300, 900))]
        return FakeResponse(200, STREAM, paced(*steps, *ANSWER_EVENTS))

    router = llama_router(
        tmp_path, script, more_env={**KEEPALIVE, "SLM_WATCHDOG_SILENCE_SECONDS": "5"}
    )

    async def scenario() -> None:
        async with serving(router):
            answer = stamped()
            began = time.monotonic()
            got = await call(
                router.app,
                CHAT,
                chat(stream=True),
                answer=answer,
                headers={"x-slm-progress": "yes"},
            )
            assert got.events() == [first_token("Hel"), delta("lo", "stop"), "[DONE]"]
            assert b"prompt_progress" not in got.body
            reports = [
                json.loads(line[len(": slm-progress ") :])
                for line in got.body.decode().splitlines()
                if line.startswith(": slm-progress ")
            ]
            assert reports, got.body
            assert {r["stage"] for r in reports} == {"reading_prompt"}
            assert all(r["prompt_tokens"] == 900 for r in reports)
            assert longest_gap(got, began) < BEAT * 4

    run(scenario())


@pytest.mark.parametrize(
    ("path", "body", "ends_with"),
    [
        (CHAT, chat(stream=True), b'"code": "deadline_exceeded_in_queue"'),
        ("/v1/messages", MESSAGES_BODY, b"event: error\ndata: "),
        ("/v1/responses", {"model": MODEL, "input": "hi", "stream": True}, b"response.failed"),
    ],
    ids=["chat", "messages", "responses"],
)
def test_a_deadline_passed_after_the_head_went_out_is_told_in_band(
    tmp_path: Path, path: str, body: dict[str, Any], ends_with: bytes
) -> None:
    release = asyncio.Event()
    router = queued_router(tmp_path, release)

    async def scenario() -> None:
        async with serving(router):
            holder = await holding(router, release)
            got = await call(router.app, path, body, headers={"x-request-timeout": "0.5"})
            release.set()
            await holder
            assert got.status == 200
            assert got.complete
            beats = PING if path == "/v1/messages" else COMMENT
            assert got.body.startswith(beats)
            assert ends_with in got.body
            assert b"queue" in got.body  # the refusal's own message
            if path == "/v1/messages":
                error = got.body.split(b"event: error\ndata: ")[1]
                assert json.loads(error)["error"]["type"] in ("timeout_error", "api_error")
            # The request never reached the backend (the holder's is the one sent).
            assert len(router.transport.sent) == 1

    run(scenario())


def test_a_backends_refusal_after_the_head_went_out_is_told_in_band(tmp_path: Path) -> None:
    release = asyncio.Event()

    async def script(sent: Sent) -> FakeResponse:
        if not sent.json().get("stream"):
            await release.wait()
            return whole(ANSWER)
        refusal = {"error": {"message": "context window exceeded", "type": "invalid"}}
        return FakeResponse(
            400, {"content-type": "application/json"}, [json.dumps(refusal).encode()]
        )

    router = make_router(tmp_path, script, concurrency=1, env=KEEPALIVE)

    async def scenario() -> None:
        async with serving(router):
            holder = await holding(router, release)
            answer = Answer()
            waiting = asyncio.ensure_future(
                call(router.app, CHAT, chat(stream=True), answer=answer)
            )
            await until(lambda: COMMENT in answer.body, "a beat")
            release.set()
            got = await waiting
            await holder
            assert got.status == 200
            [error] = got.events()
            assert error["error"]["message"] == "context window exceeded"
            assert error["error"]["type"] == "invalid_request_error"
            assert error["error"]["code"] == "backend_refused"

    run(scenario())


def test_a_stream_answered_at_once_hears_no_beat_and_a_refusal_keeps_its_status(
    tmp_path: Path,
) -> None:
    async def script(sent: Sent) -> FakeResponse:
        if sent.json()["messages"][0]["content"] == "refuse":
            body = {"error": {"message": "bad", "type": "invalid_request_error"}}
            return FakeResponse(
                400, {"content-type": "application/json"}, [json.dumps(body).encode()]
            )
        return streamed(*ANSWER_EVENTS)

    router = make_router(tmp_path, script, env=KEEPALIVE)

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, CHAT, chat(stream=True))
            assert got.body.startswith(b"data: ")
            assert COMMENT not in got.body
            refused = chat(stream=True)
            refused["messages"][0]["content"] = "refuse"
            got = await call(router.app, CHAT, refused)
            assert got.status == 400
            assert got.json()["error"]["message"] == "bad"

    run(scenario())


def test_a_request_that_does_not_stream_gets_nothing_extra_while_it_waits(
    tmp_path: Path,
) -> None:
    release = asyncio.Event()
    router = queued_router(tmp_path, release)

    async def scenario() -> None:
        async with serving(router):
            holder = await holding(router, release)
            answer = Answer()
            waiting = asyncio.ensure_future(call(router.app, CHAT, chat(), answer=answer))
            await until(lambda: router.deps.gates[router.spec.role].queued == 1, "queued")
            # Several intervals pass in the queue: nothing reaches the client.
            gate = asyncio.Event()
            asyncio.get_running_loop().call_later(BEAT * 3, gate.set)
            await gate.wait()
            assert answer.chunks == [] and answer.status == 0
            release.set()
            got = await waiting
            await holder
            assert got.status == 200
            assert got.json() == ANSWER

    run(scenario())


def test_a_messages_stream_pings_while_the_prompt_is_read(tmp_path: Path) -> None:
    """The Messages API's own keep-alive, after its opening events and before the first
    token; the events are otherwise those of a stream that never waited."""

    async def script(_sent: Sent) -> FakeResponse:
        steps: list[float | Step] = [event(progress_chunk(0))]
        steps += [BEAT * 3.5, event(progress_chunk(9, 9))]
        return FakeResponse(200, STREAM, paced(*steps, *ANSWER_EVENTS))

    router = llama_router(
        tmp_path, script, more_env={**KEEPALIVE, "SLM_WATCHDOG_SILENCE_SECONDS": "5"}
    )

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, "/v1/messages", MESSAGES_BODY)
            text = got.body.decode()
            names = [line for line in text.splitlines() if line.startswith("event: ")]
            pings = names.count("event: ping")
            assert pings >= 2
            others = [n for n in names if n != "event: ping"]
            assert others[0] == "event: message_start"
            assert others[-1] == "event: message_stop"
            # The pings come between the opening and the first token.
            assert text.index("event: ping") > text.index("event: message_start")
            assert text.rindex("event: ping") < text.index("event: content_block_start")

    run(scenario())


def test_a_client_that_leaves_while_it_hears_beats_frees_its_place(tmp_path: Path) -> None:
    release = asyncio.Event()
    router = queued_router(tmp_path, release)

    async def scenario() -> None:
        async with serving(router):
            holder = await holding(router, release)
            leave = asyncio.Event()
            answer = Answer()
            waiting = asyncio.ensure_future(
                call(router.app, CHAT, chat(stream=True), answer=answer, leave=leave)
            )
            await until(lambda: COMMENT in answer.body, "a beat")
            leave.set()
            await waiting
            gate = router.deps.gates[router.spec.role]
            await until(lambda: gate.queued == 0, "the place given up")
            release.set()
            await holder
            await until(lambda: gate.idle, "the gate idle")
            assert len(router.transport.sent) == 1

    run(scenario())


def test_the_dashboard_shows_where_each_request_under_way_waits(tmp_path: Path) -> None:
    """A request that does not stream gets nothing extra on the wire, but the dashboard
    lists it under way with its stage and its place in the line."""
    release = asyncio.Event()
    router = queued_router(tmp_path, release)

    async def scenario() -> None:
        async with serving(router):
            holder = await holding(router, release)
            first = asyncio.ensure_future(call(router.app, CHAT, chat()))
            second = asyncio.ensure_future(call(router.app, CHAT, chat()))
            gate = router.deps.gates[router.spec.role]
            await until(lambda: gate.queued == 2, "two in the line")
            listed = (await call(router.app, "/v1/ui/requests", None, method="GET")).json()
            under_way = listed["in_flight"]
            assert [r["stage"] for r in under_way] == ["sent", "queued", "queued"]
            assert [r.get("ahead") for r in under_way] == [None, 0, 1]
            assert all(r["model"] == MODEL and r["stream"] is False for r in under_way)
            release.set()
            for task in (holder, first, second):
                assert (await task).json() == ANSWER
            listed = (await call(router.app, "/v1/ui/requests", None, method="GET")).json()
            assert listed["in_flight"] == []
            assert len(listed["data"]) == 3

    run(scenario())
