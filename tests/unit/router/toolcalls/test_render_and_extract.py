"""The tools written into the prompt for a template that takes none, and the calls read
back out of the model's text: what the model sees, and what is (and is not) a call."""

from __future__ import annotations

import json
from typing import Any

import pytest

from slm_server.router.toolcalls.extract import extract_calls, hold_from
from slm_server.router.toolcalls.offer import offer_of
from slm_server.router.toolcalls.render import render_request

WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
SEARCH = {"type": "function", "function": {"name": "search"}}


def chat(**extra: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [WEATHER, SEARCH],
        **extra,
    }


def test_the_tools_go_into_a_system_turn_and_leave_the_request() -> None:
    request = chat(tool_choice="auto", parallel_tool_calls=True, temperature=0.1)
    offer = offer_of(request)
    assert offer is not None
    rendered = render_request(request, offer)
    assert not {"tools", "tool_choice", "parallel_tool_calls"} & set(rendered)
    assert rendered["temperature"] == 0.1
    system, user = rendered["messages"]
    assert system["role"] == "system" and user == request["messages"][0]
    lines = system["content"].split("<tools>\n", 1)[1].split("</tools>", 1)[0].splitlines()
    described = [json.loads(line) for line in lines]
    assert described[0] == {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": WEATHER["function"]["parameters"],
    }
    assert described[1] == {"name": "search", "parameters": {"type": "object", "properties": {}}}
    assert "<tool_call>" in system["content"]
    assert request["tools"] == [WEATHER, SEARCH], "the client's request is not changed"


def test_a_system_message_keeps_its_text_first_and_a_forced_choice_is_said() -> None:
    request = chat(tool_choice={"type": "function", "function": {"name": "search"}})
    request["messages"].insert(
        0, {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]}
    )
    offer = offer_of(request)
    assert offer is not None and offer.choice == "named" and offer.named == "search"
    system = render_request(request, offer)["messages"][0]
    assert system["role"] == "system"
    assert system["content"].startswith("Be brief.\n\n# Tools")
    assert system["content"].endswith(
        "Answer with a call to the function search now, and nothing else."
    )


def test_earlier_calls_and_their_results_become_text_turns() -> None:
    request = chat()
    request["messages"] += [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "a",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                },
                {"id": "b", "type": "function", "function": {"name": "search", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "a", "content": "sunny"},
        {"role": "tool", "tool_call_id": "b", "content": [{"type": "text", "text": "none"}]},
    ]
    offer = offer_of(request)
    assert offer is not None
    turns = render_request(request, offer)["messages"]
    assert [t["role"] for t in turns] == ["system", "user", "assistant", "user"]
    assistant, results = turns[2], turns[3]
    assert "tool_calls" not in assistant
    assert assistant["content"] == (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "search", "arguments": {}}\n</tool_call>'
    )
    assert results["content"] == (
        '<tool_response>\n{"name": "get_weather", "content": "sunny"}\n</tool_response>\n'
        '<tool_response>\n{"name": "search", "content": "none"}\n</tool_response>'
    )


def test_tool_choice_none_renders_no_tools_but_still_the_history() -> None:
    request = chat(tool_choice="none")
    offer = offer_of(request)
    assert offer is not None
    rendered = render_request(request, offer)
    assert rendered["messages"] == request["messages"]
    assert "tools" not in rendered


def test_a_named_choice_of_a_tool_not_offered_is_not_the_routers() -> None:
    assert offer_of(chat(tool_choice={"type": "function", "function": {"name": "nope"}})) is None
    assert offer_of({"messages": [], "tools": []}) is None


OFFERED = ("get_weather", "search")


@pytest.mark.parametrize(
    ("text", "kept", "calls"),
    [
        (
            'Sure! <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
            "\n</tool_call>",
            "Sure!",
            [("get_weather", {"city": "Paris"})],
        ),
        (  # cut off before the close, and broken inside
            "<tool_call>{'name': 'search', 'arguments': {'q': 'x',",
            "",
            [("search", {"q": "x"})],
        ),
        (  # a list of calls in one tag
            '<tool_call>[{"name": "search", "arguments": {}}, '
            '{"name": "get_weather", "parameters": {"city": "Rome"}}]</tool_call>',
            "",
            [("search", {}), ("get_weather", {"city": "Rome"})],
        ),
        (
            'Calling it:\n```json\n{"name": "search", "arguments": {"q": "a"}}\n```\nDone.',
            "Calling it:\n\nDone.",
            [("search", {"q": "a"})],
        ),
        (
            '{"name": "get_weather", "arguments": {"city": "Oslo"}}',
            "",
            [("get_weather", {"city": "Oslo"})],
        ),
    ],
)
def test_calls_written_as_text_are_read_back(
    text: str, kept: str, calls: list[tuple[str, Any]]
) -> None:
    rest, found = extract_calls(text, OFFERED)
    assert rest == kept
    assert [(c.name, c.arguments) for c in found] == calls


@pytest.mark.parametrize(
    "text",
    [
        "The answer is 42.",
        '```json\n{"name": "Ada", "age": 36}\n```',  # JSON, but no offered tool
        '{"name": "unknown_tool", "arguments": {}}',
        "```python\nprint('hi')\n```",
        "Use {braces} freely.",
    ],
)
def test_text_that_is_not_a_call_stays_text(text: str) -> None:
    assert extract_calls(text, OFFERED) == (text, [])


@pytest.mark.parametrize(
    ("text", "at_start", "where"),
    [
        ("Hello there", True, (11, False)),
        ("", True, (0, False)),
        ("   ", True, (0, False)),
        ('  {"name"', True, (0, True)),
        ('{"a": 1}', False, (8, False)),  # mid-answer braces are text
        ("Sure <tool_call>{", False, (5, True)),
        ("Sure <tool", False, (5, False)),  # a marker may be beginning
        ("Look:\n``", False, (6, False)),
        ("Look:\n```js", False, (6, False)),  # its language not known yet
        ("Look:\n```python\nprint()", False, (23, False)),
        ('Look:\n```json\n{"x"', False, (6, True)),
        ("Look:\n```\n[1", False, (6, True)),
        ("Look:\n```json\n", False, (6, False)),
    ],
)
def test_a_stream_holds_text_from_where_a_call_may_begin(
    text: str, at_start: bool, where: tuple[int, bool]
) -> None:
    assert hold_from(text, at_start) == where
