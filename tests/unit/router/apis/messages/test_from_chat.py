"""A chat completion translated into a Messages answer, strictly of the anthropic SDK's types."""

from __future__ import annotations

import json
from typing import Any

import pytest

from slm_server.errors import BackendProtocolError
from slm_server.router.apis.messages.from_chat import backend_error, chat_to_message, tool_input
from tests.anthropic_shapes import strict_error, strict_message

REQUEST = {"model": "smollm2-135m-instruct", "max_tokens": 32, "messages": []}


def completion(message: dict[str, Any], finish: str = "stop", **usage: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "model.gguf",
        "choices": [
            {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}
        ],
        "usage": {"prompt_tokens": 30, "completion_tokens": 5, "total_tokens": 35, **usage},
    }


def test_a_text_answer() -> None:
    raw = chat_to_message(completion({"content": "Hello!"}), REQUEST)
    message = strict_message(raw)
    assert message.id.startswith("msg_") and message.model == "smollm2-135m-instruct"
    assert [b.type for b in message.content] == ["text"]
    assert message.content[0].text == "Hello!"  # type: ignore[union-attr]
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    assert raw["usage"] == {
        "input_tokens": 30,
        "output_tokens": 5,
        "cache_read_input_tokens": 0,
        "cache_creation_input_tokens": 0,
    }


def test_cached_prompt_tokens_are_cache_reads() -> None:
    chat = completion({"content": "x"}, prompt_tokens_details={"cached_tokens": 24})
    usage = strict_message(chat_to_message(chat, REQUEST)).usage
    assert (usage.input_tokens, usage.cache_read_input_tokens) == (6, 24)


@pytest.mark.parametrize(
    ("finish", "reason"),
    [
        ("stop", "end_turn"),
        ("length", "max_tokens"),
        ("tool_calls", "tool_use"),
        (None, "end_turn"),
    ],
)
def test_stop_reasons(finish: str, reason: str) -> None:
    chat = completion({"content": "x"}, finish=finish)
    assert strict_message(chat_to_message(chat, REQUEST)).stop_reason == reason


def test_reasoning_and_tool_calls_become_thinking_and_tool_use_blocks() -> None:
    calls = [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        },
        {"type": "function", "function": {"name": "broken", "arguments": '{"city": '}},
    ]
    chat = completion({"reasoning_content": "I should look.", "content": "", "tool_calls": calls})
    message = strict_message(chat_to_message(chat, REQUEST))
    assert [b.type for b in message.content] == ["thinking", "tool_use", "tool_use"]
    thinking, first, second = message.content
    assert thinking.thinking == "I should look." and thinking.signature == ""  # type: ignore[union-attr]
    assert (first.id, first.name, first.input) == ("call_1", "get_weather", {"city": "Paris"})  # type: ignore[union-attr]
    assert second.id.startswith("toolu_") and second.input == {"_raw_arguments": '{"city": '}  # type: ignore[union-attr]
    assert message.stop_reason == "tool_use"


def test_an_empty_answer_has_no_blocks() -> None:
    message = strict_message(chat_to_message(completion({"content": None}), REQUEST))
    assert message.content == []


def test_a_completion_without_a_message_is_a_protocol_error() -> None:
    with pytest.raises(BackendProtocolError):
        chat_to_message({"choices": []}, REQUEST)


def test_tool_input_is_always_an_object() -> None:
    assert tool_input('{"a": 1}') == {"a": 1}
    assert tool_input("") == {}
    assert tool_input("[1]") == {"_raw_arguments": "[1]"}
    assert tool_input({"a": 1}) == {"a": 1}


@pytest.mark.parametrize(
    ("status", "content", "kind", "message"),
    [
        (
            400,
            json.dumps({"error": {"code": 400, "message": "too long"}}).encode(),
            "invalid_request_error",
            "too long",
        ),
        (404, b"not here", "not_found_error", "not here"),
        (500, b"", "api_error", "the backend answered 500"),
        (503, json.dumps({"error": "loading"}).encode(), "overloaded_error", "loading"),
        (429, b"{}", "rate_limit_error", "{}"),
    ],
)
def test_backend_errors_take_anthropics_shape(
    status: int, content: bytes, kind: str, message: str
) -> None:
    error = strict_error(backend_error(status, content), kind)
    assert error.error.message == message
