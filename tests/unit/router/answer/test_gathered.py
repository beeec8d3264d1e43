"""The whole chat completion rebuilt from llama-server's stream (``ChatGathering``), on
chunks written as the pinned llama-server writes them: text, reasoning, tool calls in
pieces, the progress reports (dropped), the usage chunk and the timings, a bound."""

from __future__ import annotations

from typing import Any

import pytest

from slm_server.errors import AnswerTooLarge
from slm_server.router.answer.gathered import ChatGathering

HEAD = {"created": 7, "id": "chatcmpl-x", "model": "m", "system_fingerprint": "b1-abc"}


def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    choice = {"finish_reason": finish, "index": 0, "delta": delta}
    return {"choices": [choice], **HEAD, "object": "chat.completion.chunk", **extra}


USAGE = {"completion_tokens": 5, "prompt_tokens": 9, "total_tokens": 14}
TIMINGS = {"predicted_n": 5, "prompt_n": 9}


def gathered(*chunks: dict[str, Any]) -> dict[str, Any]:
    gathering = ChatGathering(1000)
    for one in chunks:
        gathering.feed(one)
    return gathering.answer()


def test_text_with_reports_first_and_usage_last() -> None:
    answer = gathered(
        chunk({"role": "assistant", "content": None}, prompt_progress={"processed": 0}),
        chunk({"role": "assistant", "content": None}, prompt_progress={"processed": 9}),
        chunk({"content": "Hel"}),
        chunk({"content": "lo"}),
        chunk({}, "stop"),
        {
            "choices": [],
            **HEAD,
            "object": "chat.completion.chunk",
            "usage": USAGE,
            "timings": TIMINGS,
        },
    )
    assert answer == {
        "choices": [
            {
                "finish_reason": "stop",
                "index": 0,
                "message": {"role": "assistant", "content": "Hello"},
            }
        ],
        **HEAD,
        "object": "chat.completion",
        "usage": USAGE,
        "timings": TIMINGS,
    }


def test_no_text_is_an_empty_string_and_reasoning_is_kept_apart() -> None:
    answer = gathered(
        chunk({"role": "assistant", "content": None}),
        chunk({"reasoning_content": "Let me "}),
        chunk({"reasoning_content": "think."}),
        chunk({}, "length"),
    )
    message = answer["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "", "reasoning_content": "Let me think."}
    assert answer["choices"][0]["finish_reason"] == "length"
    assert "usage" not in answer and "timings" not in answer


def test_tool_calls_in_pieces_are_joined_in_their_places() -> None:
    answer = gathered(
        chunk({"role": "assistant", "content": None}),
        chunk(
            {
                "tool_calls": [
                    {"index": 0, "id": "c1", "type": "function", "function": {"name": "get"}}
                ]
            }
        ),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city":'}}]}),
        chunk({"tool_calls": [{"index": 1, "function": {"name": "put", "arguments": "{}"}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": ' "Paris"}'}}]}),
        chunk({}, "tool_calls"),
    )
    message = answer["choices"][0]["message"]
    assert message["content"] == ""
    assert message["tool_calls"] == [
        {
            "type": "function",
            "function": {"name": "get", "arguments": '{"city": "Paris"}'},
            "id": "c1",
        },
        {"type": "function", "function": {"name": "put", "arguments": "{}"}},
    ]
    assert answer["choices"][0]["finish_reason"] == "tool_calls"


def test_an_in_band_error_is_kept_as_the_answer_s_error() -> None:
    gathering = ChatGathering(1000)
    gathering.feed(chunk({"content": "a"}))
    failure = {"error": {"code": 500, "message": "boom", "type": "server_error"}}
    gathering.feed(failure)
    assert gathering.error == failure


def test_an_answer_past_the_bound_is_refused() -> None:
    gathering = ChatGathering(10)
    gathering.feed(chunk({"content": "12345"}))
    with pytest.raises(AnswerTooLarge):
        gathering.feed(chunk({"content": "678901"}))
