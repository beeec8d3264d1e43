"""Chat (and text) completions, whole or streamed, translated into Ollama's answers: a
stream of JSON lines, pieces then one ``done`` line with the counts; tool calls whole,
before it; an error line that ends it. Whatever a backend's chunks hold, the
translation gives lines of JSON and never fails."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slm_server.router.apis.ollama.answers import Clock, Kind, OllamaLines, whole_answer
from tests.json_values import json_values

CHAT = Kind(chat=True)
GENERATE = Kind(chat=False)
RAW = Kind(chat=False, completions=True)
KINDS = {"chat": CHAT, "generate": GENERATE, "raw": RAW}


def now() -> Clock:
    return Clock(time.perf_counter())


def delta(**fields: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": fields, "finish_reason": None}]}


def ended(reason: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]}


def call_piece(**fields: Any) -> dict[str, Any]:
    return delta(tool_calls=[{"index": 0, **fields}])


USAGE = {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}}


def translated(kind: Kind, chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    lines = OllamaLines(kind, "m", now())
    out: list[bytes] = [*lines.start()]
    for chunk in chunks:
        out += lines.feed(chunk)
    out += lines.finish()
    assert all(line.endswith(b"\n") and line.count(b"\n") == 1 for line in out)
    return [json.loads(line) for line in out]


def test_a_chat_stream_is_pieces_then_a_done_line_with_the_counts() -> None:
    said = [delta(role="assistant", content=""), delta(content="Hel"), delta(content="lo")]
    got = translated(CHAT, [*said, ended("length"), USAGE])
    assert [g["message"]["content"] for g in got] == ["Hel", "lo", ""]
    assert [g["done"] for g in got] == [False, False, True]
    last = got[-1]
    assert last["done_reason"] == "length"
    assert last["prompt_eval_count"] == 7 and last["eval_count"] == 3
    assert all(isinstance(last[k], int) for k in ("total_duration", "eval_duration"))


def test_a_streamed_call_is_told_whole_before_the_last_line() -> None:
    got = translated(
        CHAT,
        [
            call_piece(id="c1", function={"name": "weather", "arguments": '{"ci'}),
            call_piece(function={"arguments": 'ty": "Paris"}'}),
            ended("tool_calls"),
        ],
    )
    assert len(got) == 2
    [call] = got[0]["message"]["tool_calls"]
    weather = {"index": 0, "name": "weather", "arguments": {"city": "Paris"}}
    assert call == {"id": "c1", "function": weather}
    assert got[1]["done"] is True and got[1]["done_reason"] == "stop"


def test_a_generate_stream_answers_in_response_and_a_raw_one_from_text() -> None:
    got = translated(GENERATE, [delta(content="a"), delta(reasoning_content="hm")])
    assert got[0]["response"] == "a" and got[1]["thinking"] == "hm"
    assert "message" not in got[-1] and got[-1]["done"] is True
    text = {"choices": [{"index": 0, "text": "b", "finish_reason": "stop"}]}
    got = translated(RAW, [text])
    assert got[0]["response"] == "b" and got[-1]["done_reason"] == "stop"


def test_an_error_ends_the_stream_and_nothing_follows_it() -> None:
    lines = OllamaLines(CHAT, "m", now())
    lines.feed(delta(content="x"))
    [error] = lines.error("the backend broke")
    assert json.loads(error) == {"error": "the backend broke"}
    assert lines.feed(delta(content="y")) == []
    assert lines.finish() == []
    assert lines.error("again") == []


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_model_that_calls_a_tool_unasked_is_translated_in_every_kind(kind: str) -> None:
    """A templated ``/api/generate`` is a chat completion: a model may still answer it
    with a call, and the translation must not fail on it, whole or streamed."""
    chunks = [call_piece(id="c1", function={"name": "f", "arguments": "{}"}), ended("tool_calls")]
    got = translated(KINDS[kind], chunks)
    assert got[-1]["done"] is True
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    message = {"role": "assistant", "content": None, "tool_calls": [call]}
    answer = {"choices": [{"index": 0, "finish_reason": "tool_calls", "message": message}]}
    assert whole_answer(answer, KINDS[kind], "m", now())["done"] is True


@pytest.mark.parametrize("reason", [["stop"], {"a": 1}, 5, None, "odd"])
def test_a_finish_reason_of_any_type_is_read_as_stop(reason: Any) -> None:
    message = {"role": "assistant", "content": "x"}
    answer = {"choices": [{"index": 0, "finish_reason": reason, "message": message}]}
    whole = whole_answer(answer, CHAT, "m", now())
    assert whole["done_reason"] == "stop" and whole["message"]["content"] == "x"


values = json_values(text=6, size=3, leaves=8, integers=10**12)
calls = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "index": st.integers(0, 2) | values,
            "id": values,
            "function": st.fixed_dictionaries(
                {}, optional={"name": st.just("f") | values, "arguments": st.just("{}") | values}
            )
            | values,
        },
    ),
    max_size=2,
)
deltas = st.fixed_dictionaries(
    {},
    optional={
        "content": st.text(max_size=5) | values,
        "reasoning_content": values,
        "tool_calls": calls | values,
    },
)
choices = st.fixed_dictionaries(
    {},
    optional={
        "index": st.just(0) | values,
        "delta": deltas | values,
        "message": deltas | values,
        "text": values,
        "finish_reason": st.sampled_from(["stop", "length", "tool_calls"]) | values,
        "logprobs": values,
    },
)
chunks = st.fixed_dictionaries(
    {},
    optional={
        "choices": st.lists(choices, max_size=2) | values,
        "usage": values,
        "timings": values,
    },
)


@settings(
    max_examples=300,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(kind=st.sampled_from(sorted(KINDS)), stream=st.lists(chunks, max_size=4))
def test_no_answer_makes_the_translation_fail(kind: str, stream: list[dict[str, Any]]) -> None:
    got = translated(KINDS[kind], stream)
    assert got[-1]["done"] is True
    for chunk in stream:
        whole = whole_answer(chunk, KINDS[kind], "m", now())
        json.dumps(whole, allow_nan=False)
