"""Tool-call mistakes that the pinned llama-server answers with a 500 are refused with a
400 naming the field; what it serves passes (each case measured against the pinned
build: see tests/integration/test_tool_call_refusals.py)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from slm_server.errors import InvalidRequest
from slm_server.router.apis.messages.to_chat import messages_to_chat
from slm_server.router.apis.responses.to_chat import translate_request
from slm_server.router.intake.payload import check_fields
from slm_server.router.intake.tool_calls import check_arguments, check_tool_calls
from tests.shape_rows import shape

USER = {"role": "user", "content": "Weather in Paris?"}
CALL: dict[str, Any] = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def history(**call: Any) -> dict[str, Any]:
    """A round trip whose one tool call has ``call``'s fields (None: removed)."""
    made = copy.deepcopy(CALL)
    for key, value in call.items():
        if key.startswith("function_"):
            target, key = made["function"], key.removeprefix("function_")
        else:
            target = made
        if value is None:
            target.pop(key, None)
        else:
            target[key] = value
    return {
        "messages": [
            USER,
            {"role": "assistant", "content": "", "tool_calls": [made]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ]
    }


def tools(**function: Any) -> dict[str, Any]:
    made = copy.deepcopy(TOOL)
    made["function"].update(function)
    return {"messages": [USER], "tools": [made]}


NULL = object()  # a field present with the value null

REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    "arguments not JSON": (
        history(function_arguments="{not json"),
        "messages[1].tool_calls[0].function.arguments",
    ),
    "arguments empty": (
        history(function_arguments=""),
        "messages[1].tool_calls[0].function.arguments",
    ),
    "arguments NaN": (
        history(function_arguments='{"x": NaN}'),
        "messages[1].tool_calls[0].function.arguments",
    ),
    "arguments a JSON array": (
        history(function_arguments="[1, 2]"),
        "messages[1].tool_calls[0].function.arguments",
    ),
    "arguments a JSON string": (
        history(function_arguments='"Paris"'),
        "messages[1].tool_calls[0].function.arguments",
    ),
    "arguments a number": (
        history(function_arguments=5),
        "messages[1].tool_calls[0].function.arguments",
    ),
    "arguments missing": (
        history(function_arguments=None),
        "messages[1].tool_calls[0].function.arguments",
    ),
    "function missing": (history(function=None), "messages[1].tool_calls[0].function"),
    "function a string": (history(function="x"), "messages[1].tool_calls[0].function"),
    "name missing": (history(function_name=None), "messages[1].tool_calls[0].function.name"),
    "name a number": (history(function_name=5), "messages[1].tool_calls[0].function.name"),
    "type missing": (history(type=None), "messages[1].tool_calls[0].type"),
    "type custom": (history(type="custom"), "messages[1].tool_calls[0].type"),
    "id a number": (history(id=5), "messages[1].tool_calls[0].id"),
    "tool_calls a string": (
        {"messages": [USER, {"role": "assistant", "content": "", "tool_calls": "x"}]},
        "messages[1].tool_calls",
    ),
    "tool_calls item a string": (
        {"messages": [USER, {"role": "assistant", "content": "", "tool_calls": ["x"]}]},
        "messages[1].tool_calls[0]",
    ),
    "tool_call_id a number": (
        {"messages": [USER, {"role": "tool", "tool_call_id": 5, "content": "x"}]},
        "messages[1].tool_call_id",
    ),
    "tool message name a number": (
        {"messages": [USER, {"role": "tool", "tool_call_id": "c", "name": 5, "content": "x"}]},
        "messages[1].name",
    ),
    "text part without text": (
        {"messages": [USER, {"role": "tool", "tool_call_id": "c", "content": [{"type": "text"}]}]},
        "messages[1].content[0].text",
    ),
    "reasoning_content a number": (
        {"messages": [{"role": "assistant", "content": "", "reasoning_content": 5}, USER]},
        "messages[0].reasoning_content",
    ),
    "role missing": ({"messages": [{"content": "hi"}]}, "messages[0].role"),
    "tools an object": ({"messages": [USER], "tools": {}}, "tools"),
    "tool a string": ({"messages": [USER], "tools": ["x"]}, "tools[0]"),
    "tool type missing": (
        {"messages": [USER], "tools": [{"function": TOOL["function"]}]},
        "tools[0].type",
    ),
    "tool in the Responses shape": (
        {"messages": [USER], "tools": [{"type": "function", "name": "f", "parameters": {}}]},
        "tools[0].function",
    ),
    "tool name missing": (
        {"messages": [USER], "tools": [{"type": "function", "function": {"parameters": {}}}]},
        "tools[0].function.name",
    ),
    "tool description a number": (tools(description=5), "tools[0].function.description"),
    "tool parameters a string": (tools(parameters="x"), "tools[0].function.parameters"),
    "tool parameters with a $ref to nothing": (
        tools(parameters={"type": "object", "properties": {"a": {"$ref": "#/$defs/nope"}}}),
        "tools[0].function.parameters",
    ),
}
for field in ("id", "tool_call_id", "name", "reasoning_content"):
    # Present and null: llama-server reads each as a string.
    message: dict[str, Any] = {"role": "assistant", "content": "x", field: None}
    if field == "id":
        REFUSED["id null"] = (history(id=NULL), "messages[1].tool_calls[0].id")
        continue
    REFUSED[f"{field} null"] = ({"messages": [USER, message, USER]}, f"messages[1].{field}")
REFUSED["tool description null"] = (tools(description=NULL), "tools[0].function.description")


def unnull(value: Any) -> Any:
    if value is NULL:
        return None
    if isinstance(value, dict):
        return {k: unnull(v) for k, v in value.items()}
    if isinstance(value, list):
        return [unnull(v) for v in value]
    return value


SERVED: dict[str, dict[str, Any]] = {
    "a round trip": history(),
    "arguments as an object": history(function_arguments={"city": "Paris"}),
    "arguments null": history(function_arguments=NULL),
    "arguments JSON null": history(function_arguments="null"),
    "arguments {} with spaces": history(function_arguments=" { } "),
    "no id": history(id=None),
    "an empty name": history(function_name=""),
    "tool_calls null": {
        "messages": [USER, {"role": "assistant", "content": "", "tool_calls": NULL}]
    },
    "tool_calls empty": {
        "messages": [USER, {"role": "assistant", "content": "", "tool_calls": []}]
    },
    "a tool result without its call": {
        "messages": [USER, {"role": "tool", "tool_call_id": "nope", "content": "x"}]
    },
    "a tool result of text parts": {
        "messages": [
            USER,
            {"role": "tool", "tool_call_id": "c", "content": [{"type": "text", "text": "a"}]},
        ]
    },
    "a role llama-server does not know": {"messages": [{"role": "wizard", "content": "hi"}]},
    "tools null": {"messages": [USER], "tools": NULL},
    "tools empty": {"messages": [USER], "tools": []},
    "a tool without description or parameters": {
        "messages": [USER],
        "tools": [{"type": "function", "function": {"name": "f"}}],
    },
    "parameters null": tools(parameters=NULL),
    "parameters {}": tools(parameters={}),
    "an unusual but usable schema": tools(
        parameters={
            "type": "object",
            "properties": {
                "n": {"type": "integer", "minimum": 5, "maximum": 1},
                "s": {"type": "string", "pattern": "(", "format": "email"},
                "t": {"type": ["string", "null"]},
                "u": {"anyOf": [{"type": "number"}, {"$ref": "#/$defs/node"}]},
            },
            "$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}}}},
            "required": "n",
            "x-unknown": [1],
        }
    ),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_what_llama_server_fails_on_is_refused_naming_the_field(name: str) -> None:
    body, param = REFUSED[name]
    payload = {"model": "m", **unnull(body)}
    with pytest.raises(InvalidRequest) as refused:
        check_fields(payload, shape("/v1/chat/completions"), model_type="lm")
    assert refused.value.param == param
    assert refused.value.status == 400
    assert f"`{param}`" in refused.value.message


@pytest.mark.parametrize("name", sorted(SERVED))
def test_what_llama_server_serves_passes(name: str) -> None:
    check_tool_calls({"model": "m", **unnull(SERVED[name])})


def test_only_chat_completions_is_checked_so() -> None:
    body = {"model": "m", **history(function_arguments="{oops")}
    for endpoint in ("/v1/completions", "/v1/embeddings", "/v1/responses", "/v1/messages"):
        check_fields(body, shape(endpoint), model_type="lm")


@pytest.mark.parametrize(
    ("arguments", "ok"),
    [
        *[('{"a": 1}', True), ("{}", True), (None, True), ({"a": 1}, True), ("null", True)],
        *[("", False), ("{", False), ("[1]", False), ("1", False), ('"x"', False)],
        *[([1], False), (True, False), ('{"a": Infinity}', False), ('{"a": "\\ud800"}', False)],
    ],
)
def test_arguments_are_a_json_object(arguments: Any, ok: bool) -> None:
    if ok:
        check_arguments(arguments, "args")
        return
    with pytest.raises(InvalidRequest) as refused:
        check_arguments(arguments, "args")
    assert refused.value.param == "args"


# --- The translations refuse with their own field names, and make nothing refusable. ---


def test_a_responses_function_call_with_broken_arguments_is_refused() -> None:
    body = {
        "model": "m",
        "input": [
            {"role": "user", "content": "hi"},
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{oops"},
            {"type": "function_call_output", "call_id": "c", "output": "x"},
        ],
    }
    with pytest.raises(InvalidRequest) as refused:
        translate_request(body)
    assert refused.value.param == "input[1].arguments"


@pytest.mark.parametrize(
    ("tool", "param"),
    [
        ({"type": "function", "name": "f", "description": 5}, "tools[0].description"),
        ({"type": "function", "name": "f", "parameters": "x"}, "tools[0].parameters"),
        (
            {
                "type": "namespace",
                "name": "ns",
                "tools": [{"type": "function", "name": "f", "parameters": [1]}],
            },
            "tools[0].tools[0].parameters",
        ),
    ],
)
def test_a_responses_tool_llama_server_fails_on_is_refused(
    tool: dict[str, Any], param: str
) -> None:
    with pytest.raises(InvalidRequest) as refused:
        translate_request({"model": "m", "input": "hi", "tools": [tool]})
    assert refused.value.param == param


def test_a_messages_tool_schema_llama_server_fails_on_is_refused() -> None:
    body = {
        "model": "m",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"name": "f", "input_schema": {"type": "object", "properties": {"a": True}}}],
    }
    with pytest.raises(InvalidRequest) as refused:
        messages_to_chat(body, takes_images=False)
    assert refused.value.param == "tools[0].input_schema"


def test_the_translations_of_a_tool_round_trip_pass_the_chat_checks() -> None:
    responses = translate_request(
        {
            "model": "m",
            "input": [
                {"role": "user", "content": "hi"},
                {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                {
                    "type": "function_call_output",
                    "call_id": "c",
                    "output": [{"type": "input_text", "text": "x"}],
                },
                {"type": "custom_tool_call", "call_id": "d", "name": "g", "input": "raw text"},
                {"type": "custom_tool_call_output", "call_id": "d", "output": "ok"},
            ],
            "tools": [
                {"type": "function", "name": "f", "parameters": {"type": "object"}},
                {"type": "custom", "name": "g"},
                {"type": "namespace", "name": "ns", "tools": [{"type": "function", "name": "h"}]},
            ],
        }
    )
    check_tool_calls(responses.chat)
    messages = messages_to_chat(
        {
            "model": "m",
            "max_tokens": 8,
            "messages": [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t",
                            "content": [{"type": "text", "text": "x"}],
                        }
                    ],
                },
            ],
            "tools": [{"name": "f", "input_schema": {"type": "object"}}],
        },
        takes_images=False,
    )
    check_tool_calls(messages)
