"""Responses tools offered to a chat model (:mod:`slm_server.router.apis.responses.tools`):
functions as they are, custom tools as a function of one string, a namespace's tools
under ``<namespace>__<name>``, hosted tools left out, and every refusal naming its field."""

from __future__ import annotations

from typing import Any, get_args

import pytest
from openai.types.responses import Tool

from slm_server.errors import InvalidRequest
from slm_server.router.apis.responses.tools import (
    CLIENT_BUILTINS,
    HOSTED_TOOLS,
    ToolRef,
    chat_tool_choice,
    offer_of,
    offer_tools,
)

WEATHER = {
    "type": "function",
    "name": "weather",
    "description": "Current weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    "strict": True,
}
PATCH = {"type": "custom", "name": "apply_patch", "description": "Edit files"}
CRM = {
    "type": "namespace",
    "name": "crm",
    "description": "The CRM",
    "tools": [
        {"type": "function", "name": "lookup", "parameters": {"type": "object"}},
        {"type": "custom", "name": "note", "defer_loading": True},
    ],
}


def names(tools: list[dict[str, Any]]) -> list[str]:
    return [tool["function"]["name"] for tool in tools]


def test_function_custom_and_namespace_tools_become_chat_functions() -> None:
    offer = offer_tools([WEATHER, PATCH, CRM])
    assert names(offer.chat_tools) == ["weather", "apply_patch", "crm__lookup", "crm__note"]
    assert offer.chat_tools[0] == {
        "type": "function",
        "function": {
            "name": "weather",
            "description": "Current weather",
            "parameters": WEATHER["parameters"],
        },
    }
    custom = offer.chat_tools[1]["function"]
    assert custom["description"] == "Edit files"
    assert custom["parameters"]["required"] == ["input"]
    assert custom["parameters"]["properties"]["input"]["type"] == "string"
    assert offer.ref("weather") == ToolRef("function", "weather")
    assert offer.ref("apply_patch") == ToolRef("custom", "apply_patch")
    assert offer.ref("crm__lookup") == ToolRef("function", "lookup", "crm")
    assert offer.ref("crm__note") == ToolRef("custom", "note", "crm")
    assert offer.ref("unknown") == ToolRef("function", "unknown")
    assert offer.dropped == []


def test_a_custom_tool_s_grammar_is_spelled_out_for_the_model() -> None:
    grammar = {"type": "grammar", "syntax": "lark", "definition": "start: WORD"}
    offer = offer_tools([{**PATCH, "format": grammar}, {"type": "custom", "name": "raw"}])
    described = offer.chat_tools[0]["function"]["description"]
    assert described.startswith("Edit files\n\n")
    assert "lark grammar:\nstart: WORD" in described
    assert "description" not in offer.chat_tools[1]["function"]
    plain = offer_tools([{**PATCH, "format": {"type": "text"}}])
    assert plain.chat_tools[0]["function"]["description"] == "Edit files"


def test_hosted_tools_are_left_out_and_named_once_each() -> None:
    tools = [
        {"type": "web_search"},
        WEATHER,
        {"type": "mcp", "server_label": "deepwiki"},
        {"type": "web_search"},
        {"type": "tool_search", "execution": "client"},
        {"type": "image_generation", "output_format": "png"},
    ]
    offer = offer_tools(tools)
    assert names(offer.chat_tools) == ["weather"]
    assert offer.dropped == ["web_search", "mcp", "tool_search", "image_generation"]


def test_every_tool_type_of_the_sdk_is_offered_left_out_or_refused_on_purpose() -> None:
    """Each type the openai package's Tool union holds is known here: none falls
    through to the catch-all refusal."""
    types: set[str] = set()
    for member in get_args(get_args(Tool)[0]):
        types.update(get_args(member.model_fields["type"].annotation))
    assert {"namespace", "custom", "web_search", "apply_patch"} <= types
    assert types <= HOSTED_TOOLS | CLIENT_BUILTINS | {"function", "custom", "namespace"}


@pytest.mark.parametrize(
    ("tools", "param"),
    [
        ({"type": "function"}, "tools"),
        (["x"], "tools[0]"),
        ([{"type": "local_shell"}], "tools[0].type"),
        ([{"type": "shell"}], "tools[0].type"),
        ([{"type": "apply_patch"}], "tools[0].type"),
        ([{"type": "retrieval"}], "tools[0].type"),
        ([{"type": "function", "function": {"name": "f"}}], "tools[0].name"),
        ([{"type": "custom"}], "tools[0].name"),
        ([{"type": "namespace", "tools": []}], "tools[0].name"),
        ([{"type": "namespace", "name": "n"}], "tools[0].tools"),
        ([{"type": "namespace", "name": "n", "tools": ["f"]}], "tools[0].tools[0]"),
        (
            [{"type": "namespace", "name": "n", "tools": [{"type": "web_search"}]}],
            "tools[0].tools[0].type",
        ),
        ([WEATHER, WEATHER], "tools[1].name"),
        (
            [
                {"type": "function", "name": "crm__lookup"},
                CRM,
            ],
            "tools[1].tools[0].name",
        ),
        ([{**PATCH, "format": {"type": "regex"}}], "tools[0].format"),
        ([{**PATCH, "format": {"type": "grammar", "syntax": "lark"}}], "tools[0].format"),
    ],
)
def test_tools_that_cannot_be_offered_are_refused_naming_the_field(tools: Any, param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        offer_tools(tools)
    assert caught.value.param == param
    assert caught.value.status == 400


def test_the_offer_for_an_answer_never_raises() -> None:
    assert offer_of({"tools": [{"type": "shell"}]}).refs == {}
    assert offer_of({}).refs == {}
    assert offer_of({"tools": [CRM]}).ref("crm__lookup").namespace == "crm"


@pytest.mark.parametrize("mode", ["auto", "none", "required"])
def test_tool_choice_modes_stay(mode: str) -> None:
    offer = offer_tools([WEATHER, PATCH, CRM])
    assert chat_tool_choice(mode, offer) == mode
    assert len(offer.chat_tools) == 4


@pytest.mark.parametrize(
    ("choice", "forced"),
    [
        ({"type": "function", "name": "weather"}, "weather"),
        ({"type": "custom", "name": "apply_patch"}, "apply_patch"),
        ({"type": "function", "name": "crm.lookup"}, "crm__lookup"),
        ({"type": "function", "name": "crm__lookup"}, "crm__lookup"),
        ({"type": "custom", "name": "crm.note"}, "crm__note"),
    ],
)
def test_a_tool_choice_of_one_tool_offers_it_alone_and_requires_it(
    choice: Any, forced: str
) -> None:
    """The pinned llama-server ignores a tool_choice naming a function (it takes only
    the modes), so the one tool is offered alone, under "required"."""
    offer = offer_tools([WEATHER, PATCH, CRM])
    assert chat_tool_choice(choice, offer) == "required"
    assert names(offer.chat_tools) == [forced]


def test_allowed_tools_narrow_what_the_model_is_offered() -> None:
    offer = offer_tools([WEATHER, PATCH, CRM, {"type": "web_search"}])
    choice = {
        "type": "allowed_tools",
        "mode": "required",
        "tools": [
            {"type": "function", "name": "weather"},
            {"type": "namespace", "name": "crm"},
            {"type": "web_search"},
        ],
    }
    assert chat_tool_choice(choice, offer) == "required"
    assert names(offer.chat_tools) == ["weather", "crm__lookup", "crm__note"]


@pytest.mark.parametrize(
    ("choice", "param"),
    [
        ("sometimes", "tool_choice"),
        ({"type": "web_search_preview"}, "tool_choice"),
        ({"type": "mcp", "server_label": "x"}, "tool_choice"),
        ({"type": "function", "name": "missing"}, "tool_choice.name"),
        ({"type": "function", "name": "apply_patch"}, "tool_choice.name"),
        ({"type": "custom", "name": "weather"}, "tool_choice.name"),
        ({"type": "allowed_tools", "mode": "sometimes", "tools": []}, "tool_choice"),
        (
            {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "shell"}]},
            "tool_choice.tools[0].type",
        ),
        (
            {"type": "allowed_tools", "mode": "required", "tools": [{"type": "web_search"}]},
            "tool_choice",
        ),
    ],
)
def test_tool_choices_that_cannot_be_honoured_are_refused(choice: Any, param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        chat_tool_choice(choice, offer_tools([WEATHER, PATCH, {"type": "web_search"}]))
    assert caught.value.param == param


def test_required_with_nothing_to_call_is_refused() -> None:
    with pytest.raises(InvalidRequest) as caught:
        chat_tool_choice("required", offer_tools([{"type": "web_search"}]))
    assert caught.value.param == "tool_choice"
