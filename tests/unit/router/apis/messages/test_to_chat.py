"""A Messages request checked and translated into chat completions."""

from __future__ import annotations

import json
from typing import Any

import pytest

from slm_server.errors import InvalidRequest
from slm_server.router.apis.messages.to_chat import messages_to_chat

MODEL = "smollm2-135m-instruct"
PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5E"
    "rkJggg=="
)
WEATHER = {
    "name": "get_weather",
    "description": "Weather for a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def body(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 32,
        "messages": [{"role": "user", "content": "hi"}],
    }
    base.update(fields)
    return base


def chat(images: bool = False, **fields: Any) -> dict[str, Any]:
    return messages_to_chat(body(**fields), takes_images=images)


def refused(param: str, images: bool = False, **fields: Any) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        chat(images, **fields)
    assert caught.value.param == param, caught.value.message
    assert caught.value.status == 400
    return caught.value


def tool_turn(result: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me check."},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "get_weather",
                    "input": {"city": "Paris"},
                },
            ],
        },
        {"role": "user", "content": [result, {"type": "text", "text": "And then?"}]},
    ]


def test_a_plain_request_becomes_a_chat_request() -> None:
    got = chat(
        temperature=0.2, top_p=0.9, top_k=40, stop_sequences=["END"], metadata={"user_id": "u"}
    )
    assert got == {
        "model": MODEL,
        "max_tokens": 32,
        "messages": [{"role": "user", "content": "hi"}],
        "temperature": 0.2,
        "top_p": 0.9,
        "top_k": 40,
        "stop": ["END"],
    }


def test_a_stream_asks_for_usage() -> None:
    got = chat(stream=True)
    assert got["stream"] is True and got["stream_options"] == {"include_usage": True}
    assert "stream" not in chat(stream=False)


def test_system_as_a_string_or_blocks_leads_and_the_billing_line_is_dropped() -> None:
    assert chat(system="Be brief.")["messages"][0] == {"role": "system", "content": "Be brief."}
    blocks = [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1; cch=abc;"},
        {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Be brief."},
    ]
    got = chat(system=blocks)["messages"]
    assert got[0] == {"role": "system", "content": "You are Claude Code.\nBe brief."}
    assert got[1] == {"role": "user", "content": "hi"}


def test_multi_turn_text_blocks_join_and_thinking_blocks_are_dropped() -> None:
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                {"type": "redacted_thinking", "data": "xx"},
                {"type": "text", "text": "Hello"},
            ],
        },
        {"role": "user", "content": "again"},
    ]
    assert chat(messages=messages)["messages"] == [
        {"role": "user", "content": "a\nb"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "again"},
    ]


def test_tools_and_tool_choice_take_the_chat_shape() -> None:
    got = chat(tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"})
    assert got["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": WEATHER["input_schema"],
                "description": "Weather for a city",
            },
        }
    ]
    assert got["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert chat(tools=[WEATHER], tool_choice={"type": "any"})["tool_choice"] == "required"
    assert chat(tools=[WEATHER], tool_choice={"type": "none"})["tool_choice"] == "none"
    auto = chat(tools=[WEATHER], tool_choice={"type": "auto", "disable_parallel_tool_use": True})
    assert auto["tool_choice"] == "auto" and auto["parallel_tool_calls"] is False


def test_a_tool_round_trip_becomes_tool_calls_and_a_tool_message_first() -> None:
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny, 20C"}
    got = chat(tools=[WEATHER], messages=tool_turn(result))["messages"]
    assert got[1] == {
        "role": "assistant",
        "content": "Let me check.",
        "tool_calls": [
            {
                "id": "toolu_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})},
            }
        ],
    }
    assert got[2] == {"role": "tool", "tool_call_id": "toolu_1", "content": "Sunny, 20C"}
    assert got[3] == {"role": "user", "content": "And then?"}


def test_an_error_result_and_a_result_of_several_blocks() -> None:
    error = {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True, "content": "down"}
    assert chat(messages=tool_turn(error))["messages"][2]["content"] == "Error: down"
    several = {
        "type": "tool_result",
        "tool_use_id": "toolu_1",
        "content": [{"type": "text", "text": "Sunny"}, {"type": "text", "text": "20C"}],
    }
    assert chat(messages=tool_turn(several))["messages"][2]["content"] == "Sunny\n20C"
    empty = {"type": "tool_result", "tool_use_id": "toolu_1"}
    assert chat(messages=tool_turn(empty))["messages"][2]["content"] == ""


def test_a_tool_result_must_answer_a_tool_use_of_the_message_before() -> None:
    stray = {"type": "tool_result", "tool_use_id": "toolu_9", "content": "x"}
    refused("messages[2].content[0].tool_use_id", messages=tool_turn(stray))
    alone = [{"role": "user", "content": [stray]}]
    refused("messages[0].content[0].tool_use_id", messages=alone)


def test_every_tool_use_must_be_answered_in_the_next_message() -> None:
    turn = tool_turn({"type": "text", "text": "no result"})
    refused("messages[2]", messages=turn)
    refused("messages[1]", messages=turn[:2])  # the conversation ends on the call


def test_images_where_the_model_takes_them() -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}
    messages = [{"role": "user", "content": [image, {"type": "text", "text": "what?"}]}]
    got = chat(True, messages=messages)["messages"][0]["content"]
    assert got == [
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
        {"type": "text", "text": "what?"},
    ]
    url = {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}
    got = chat(True, messages=[{"role": "user", "content": [url]}])["messages"][0]["content"]
    assert got == [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}]
    error = refused("messages[0].content[0]", messages=messages)
    assert "takes no images" in error.message
    bad = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "@@"}}
    refused(
        "messages[0].content[0].source.data", True, messages=[{"role": "user", "content": [bad]}]
    )


def test_thinking_sets_enable_thinking_unless_the_request_does() -> None:
    on = chat(thinking={"type": "enabled", "budget_tokens": 1024})
    assert on["chat_template_kwargs"] == {"enable_thinking": True}
    off = chat(thinking={"type": "disabled"})
    assert off["chat_template_kwargs"] == {"enable_thinking": False}
    mine = {"enable_thinking": False, "x": 1}
    kept = chat(thinking={"type": "enabled", "budget_tokens": 1024}, chat_template_kwargs=mine)
    assert kept["chat_template_kwargs"] == {"enable_thinking": False, "x": 1}
    assert mine == {"enable_thinking": False, "x": 1}  # the request is not changed
    assert "chat_template_kwargs" not in chat()


@pytest.mark.parametrize(
    ("thinking", "max_tokens"),
    [
        ({"type": "enabled", "budget_tokens": 1024}, 2048),
        ({"type": "enabled", "budget_tokens": 31999}, 32000),  # Claude Code before adaptive
        ({"type": "enabled", "budget_tokens": 31999}, 256),  # a budget past max_tokens
        ({"type": "enabled", "budget_tokens": 63999}, 32000),  # as interleaved thinking allows
        ({"type": "adaptive"}, 32000),  # Claude Code 2.1
        ({"type": "disabled"}, 16),
    ],
)
def test_a_thinking_budget_anthropic_takes_passes_and_is_not_sent_on(
    thinking: dict[str, Any], max_tokens: int
) -> None:
    got = chat(thinking=thinking, max_tokens=max_tokens)
    assert got["max_tokens"] == max_tokens
    assert got["chat_template_kwargs"] == {"enable_thinking": thinking["type"] != "disabled"}
    assert "thinking" not in got and "budget_tokens" not in json.dumps(got)


def test_unknown_fields_are_forwarded_and_anthropic_only_ones_dropped() -> None:
    got = chat(seed=7, min_p=0.1, service_tier="auto", context_management={}, container=None)
    assert got["seed"] == 7 and got["min_p"] == 0.1
    assert not {"service_tier", "context_management", "container", "metadata"} & set(got)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"max_tokens": None}, "max_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        (
            {"messages": [{"role": "user", "content": [{"type": "document"}]}]},
            "messages[0].content[0].type",
        ),
        (
            {"messages": [{"role": "assistant", "content": [{"type": "server_tool_use"}]}]},
            "messages[0].content[0].type",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]},
            "messages[0].content[0].text",
        ),
        ({"system": 3}, "system"),
        ({"system": [{"type": "image"}]}, "system[0]"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_k": True}, "top_k"),
        ({"stop_sequences": "END"}, "stop_sequences"),
        ({"stop_sequences": [""]}, "stop_sequences"),
        ({"stream": "yes"}, "stream"),
        ({"metadata": []}, "metadata"),
        ({"tools": {}}, "tools"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
        ({"tools": [{"name": "f"}]}, "tools[0].input_schema"),
        ({"tools": [{"input_schema": {}}]}, "tools[0].name"),
        ({"tool_choice": "auto"}, "tool_choice.type"),
        ({"tool_choice": {"type": "tool"}}, "tool_choice.name"),
        ({"thinking": {"type": "maybe"}}, "thinking.type"),
        ({"thinking": {"type": "enabled", "budget_tokens": "lots"}}, "thinking.budget_tokens"),
        ({"thinking": {"type": "enabled"}}, "thinking.budget_tokens"),
        ({"thinking": {"type": "enabled", "budget_tokens": None}}, "thinking.budget_tokens"),
        ({"thinking": {"type": "enabled", "budget_tokens": 1023}}, "thinking.budget_tokens"),
        ({"thinking": {"type": "enabled", "budget_tokens": 0}}, "thinking.budget_tokens"),
        ({"thinking": {"type": "enabled", "budget_tokens": 2048.0}}, "thinking.budget_tokens"),
        ({"mcp_servers": [{"type": "url", "url": "https://x", "name": "x"}]}, "mcp_servers"),
    ],
)
def test_what_cannot_be_served_is_refused_naming_the_field(
    fields: dict[str, Any], param: str
) -> None:
    refused(param, **fields)


def test_a_tool_use_needs_an_object_input_and_a_unique_id() -> None:
    def turn(block: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"role": "user", "content": "x"}, {"role": "assistant", "content": [block]}]

    use = {"type": "tool_use", "id": "t1", "name": "f", "input": "notobj"}
    refused("messages[1].content[0].input", messages=turn(use))
    twice = [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": [{**use, "input": {}}, {**use, "input": {}}]},
    ]
    refused("messages[1].content[1].id", messages=twice)


def test_count_tokens_needs_no_max_tokens() -> None:
    request = {k: v for k, v in body().items() if k != "max_tokens"}
    assert "max_tokens" not in messages_to_chat(request, takes_images=False, counting=True)
    with pytest.raises(InvalidRequest):
        messages_to_chat(request, takes_images=False)


def test_a_system_message_keeps_its_place() -> None:
    messages = [
        {"role": "user", "content": "a"},
        {"role": "system", "content": [{"type": "text", "text": "Now be terse."}]},
        {"role": "user", "content": "b"},
    ]
    assert chat(messages=messages)["messages"][1] == {"role": "system", "content": "Now be terse."}
