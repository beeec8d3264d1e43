"""A chat completions stream translated into the Messages API's events, each strictly of the
anthropic SDK's types and in Anthropic's order, and accumulated by the SDK's own code."""

from __future__ import annotations

import json
from typing import Any

from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message

from slm_server.errors import BackendTimeout
from slm_server.router.apis.messages.endpoint import MessagesTranslation
from slm_server.router.apis.messages.events import MessageStreamTranslator
from tests.anthropic_shapes import EVENTS, sse_events, strict_events

REQUEST = {"model": "m", "max_tokens": 32, "messages": [], "stream": True}


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None) -> dict[str, Any]:
    return {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}],
    }


def usage(prompt: int, completion: int, cached: int = 0) -> dict[str, Any]:
    return {
        "object": "chat.completion.chunk",
        "choices": [],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        },
    }


def run(chunks: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    translator = MessageStreamTranslator(REQUEST)
    raw = translator.start()
    for item in chunks:
        raw += translator.feed(item)
    raw += translator.finish()
    assert translator.closed and translator.finish() == []
    return sse_events(b"".join(raw))


def final(events: list[tuple[str, dict[str, Any]]]) -> Message:
    """The message the SDK's own accumulator makes of the events (ping skipped, as the SDK does)."""
    snapshot = None
    buffers: dict[int, bytes] = {}
    for name, data in events:
        if name != "ping":
            event = EVENTS.validate_python(data)
            snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=buffers)
    assert snapshot is not None
    return Message.model_validate(snapshot.model_dump())


def test_a_text_stream() -> None:
    events = run(
        [
            chunk({"role": "assistant", "content": None}),
            chunk({"content": "Hel"}),
            chunk({"content": "lo"}),
            chunk(finish="length"),
            usage(30, 2, cached=20),
        ]
    )
    strict_events([data for _, data in events])
    names = [name for name, _ in events]
    assert names == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert delta["usage"]["input_tokens"] == 10 and delta["usage"]["output_tokens"] == 2
    message = final(events)
    assert message.content[0].text == "Hello"  # type: ignore[union-attr]
    assert message.stop_reason == "max_tokens"
    assert (message.usage.input_tokens, message.usage.cache_read_input_tokens) == (10, 20)


def test_thinking_then_text_then_tool_calls() -> None:
    events = run(
        [
            chunk({"reasoning_content": "Let me "}),
            chunk({"reasoning_content": "think."}),
            chunk({"content": "Checking."}),
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "call_a",
                            "function": {"name": "get_weather", "arguments": ""},
                        }
                    ]
                }
            ),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city":'}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": ' "Paris"}'}}]}),
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": 1,
                            "id": "call_b",
                            "function": {"name": "get_time", "arguments": "{}"},
                        }
                    ]
                }
            ),
            chunk(finish="tool_calls"),
            usage(40, 12),
        ]
    )
    strict_events([data for _, data in events])
    starts = [d["content_block"] for n, d in events if n == "content_block_start"]
    assert [b["type"] for b in starts] == ["thinking", "text", "tool_use", "tool_use"]
    assert starts[2] == {"type": "tool_use", "id": "call_a", "name": "get_weather", "input": {}}
    deltas = [d["delta"]["type"] for n, d in events if n == "content_block_delta"]
    assert deltas == [
        "thinking_delta",
        "thinking_delta",
        "text_delta",
        "input_json_delta",
        "input_json_delta",
    ]
    message = final(events)
    assert message.stop_reason == "tool_use"
    thinking, text, first, second = message.content
    assert thinking.thinking == "Let me think."  # type: ignore[union-attr]
    assert text.text == "Checking."  # type: ignore[union-attr]
    assert first.input == {"city": "Paris"} and second.input == {}  # type: ignore[union-attr]


def test_broken_tool_arguments_still_accumulate() -> None:
    events = run(
        [
            chunk({"tool_calls": [{"index": 0, "function": {"name": "f", "arguments": '{"a": '}}]}),
            chunk(finish="tool_calls"),
        ]
    )
    strict_events([data for _, data in events])
    block = final(events).content[0]
    assert block.input == {"_raw_arguments": '{"a": '}  # type: ignore[union-attr]
    assert block.id.startswith("toolu_")  # type: ignore[union-attr]


def test_an_empty_stream_is_still_whole() -> None:
    events = run([])
    strict_events([data for _, data in events])
    assert final(events).content == []
    assert final(events).stop_reason == "end_turn"


def test_a_cut_stream_ends_with_the_error_event() -> None:
    translation = MessagesTranslation(REQUEST)
    raw = translation.translator.feed(chunk({"content": "Hi"}))
    raw.append(translation.stream_error(BackendTimeout("deadline", code="deadline_exceeded")))
    events = sse_events(b"".join(raw))
    strict_events([data for _, data in events], ends="error")
    assert events[-1][1]["error"]["type"] == "timeout_error"
    assert translation.translator.closed and translation.translator.finish() == []


def test_events_are_one_line_of_json_each() -> None:
    translator = MessageStreamTranslator(REQUEST)
    for raw in translator.feed(chunk({"content": "a\nb"})):
        head, data, rest = raw.split(b"\n", 2)
        assert rest == b"\n" and head.startswith(b"event: ")
        json.loads(data[len(b"data: ") :])
