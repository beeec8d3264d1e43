"""Translated answers cut by the model's preset cap: a finished turn on the Messages and
Responses APIs when the client's own bound was larger (``end_turn``, ``completed``), a
cut as ever when the client's bound was what ended it (``max_tokens``,
``incomplete``). Claude Code and Codex CLI take a cut as a failure and ask again with
a larger bound, which the cap would only cut again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from slm_server.router.answer.translation import cap_ends_turn
from tests.anthropic_shapes import sse_events, strict_events, strict_message
from tests.openai_shapes import strict_events as strict_response_events
from tests.openai_shapes import strict_response
from tests.unit.router.inprocess import (
    FakeResponse,
    Sent,
    call,
    make_router,
    run,
    serving,
    sse,
    whole,
)

# Every test here runs twice: through plain ASGI and through the door (its fast path).
pytestmark = pytest.mark.usefixtures("via")

MODEL = "org/chat-model"
CAP = 8
PRESET = f"    preset:\n      max_output_tokens: {CAP}\n"
CUT: dict[str, Any] = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": MODEL,
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "a b c d e f g h"},
            "finish_reason": "length",
        }
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": CAP, "total_tokens": 3 + CAP},
}


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def cut_stream() -> FakeResponse:
    return sse(chunk({"role": "assistant", "content": "a b"}), chunk({}, "length"))


def answering(make: Any) -> Any:
    async def script(_sent: Sent) -> FakeResponse:
        response: FakeResponse = make()
        return response

    return script


def test_cap_ends_turn_makes_a_length_finish_a_stop_and_leaves_the_rest() -> None:
    assert cap_ends_turn(CUT)["choices"][0]["finish_reason"] == "stop"
    assert CUT["choices"][0]["finish_reason"] == "length"  # not changed in place
    ended = chunk({"content": "x"}, "stop")
    assert cap_ends_turn(ended) is ended
    assert cap_ends_turn({"choices": [], "usage": {}}) == {"choices": [], "usage": {}}
    assert cap_ends_turn({"object": "error"}) == {"object": "error"}


@pytest.mark.parametrize(
    ("asked", "expected"),
    [(32000, "end_turn"), (CAP, "max_tokens"), (4, "max_tokens")],
)
def test_messages_a_cut_by_the_cap_is_the_end_of_the_turn(
    tmp_path: Path, asked: int, expected: str
) -> None:
    """Claude Code sends max_tokens 32000: a cap of 8 ending the answer is end_turn. A
    bound of the client's own at or below the cap ends it as max_tokens, as ever."""
    router = make_router(tmp_path, answering(lambda: whole(CUT)), chat=PRESET)
    body = {"model": MODEL, "max_tokens": asked, "messages": [{"role": "user", "content": "hi"}]}

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, "/v1/messages", body)
            assert got.status == 200, got.body
            assert strict_message(got.json()).stop_reason == expected

    async def stream_scenario() -> None:
        async with serving(router):
            streamed = await call(router.app, "/v1/messages", {**body, "stream": True})
            events = strict_events([data for _, data in sse_events(streamed.body)])
            [delta] = [e for e in events if e.type == "message_delta"]
            assert delta.delta.stop_reason == expected

    run(scenario())
    router.transport.script = answering(cut_stream)
    run(stream_scenario())


@pytest.mark.parametrize(
    ("asked", "expected"),
    [(None, "completed"), (32000, "completed"), (CAP, "incomplete"), (4, "incomplete")],
)
def test_responses_a_cut_by_the_cap_completes_the_response(
    tmp_path: Path, asked: int | None, expected: str
) -> None:
    """Codex CLI sends no max_output_tokens and fails a run on ``incomplete``: a cap
    ending the answer completes it. A bound of the client's own still makes it
    incomplete."""
    router = make_router(tmp_path, answering(lambda: whole(CUT)), chat=PRESET)
    body: dict[str, Any] = {"model": MODEL, "input": "hi"}
    if asked is not None:
        body["max_output_tokens"] = asked

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, "/v1/responses", body)
            assert got.status == 200, got.body
            response = strict_response(got.json())
            assert response.status == expected
            assert response.max_output_tokens == min(asked or CAP, CAP)

    async def stream_scenario() -> None:
        async with serving(router):
            streamed = await call(router.app, "/v1/responses", {**body, "stream": True})
            lines = streamed.body.decode().split("\n")
            raw = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
            events = strict_response_events(raw)
            assert events[-1].type == f"response.{expected}"

    run(scenario())
    router.transport.script = answering(cut_stream)
    run(stream_scenario())


def test_chat_completions_pass_a_cut_through_as_it_is(tmp_path: Path) -> None:
    """Chat completions are not translated: the backend's ``length`` is the client's to
    read (opencode, on chat completions, ends its step on it)."""
    router = make_router(tmp_path, answering(lambda: whole(CUT)), chat=PRESET)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}

    async def scenario() -> None:
        async with serving(router):
            got = await call(router.app, "/v1/chat/completions", body)
            assert got.json()["choices"][0]["finish_reason"] == "length"

    run(scenario())
