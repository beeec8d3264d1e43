"""Tool calls, tool results and tool definitions in a chat completions request, checked
for what the pinned llama-server answers with a 5xx of its own. Pure.

llama-server reads a request's messages and tools into its own types
(``common_chat_msgs_parse_oaicompat``, ``common_chat_tools_parse_oaicompat`` in
common/chat.cpp at the pin) and turns every mismatch there into a 500; a template that
takes tool-call arguments as objects (Qwen3, Qwen3-Coder, Hermes...) parses each call's
``arguments`` and fails with a 500 on text that is not JSON, and one that iterates them
(Qwen3-Coder) on anything but an object; a template that calls tools builds a parser
from each tool's ``parameters`` (:mod:`.tool_schema`). The watchdog would count each of
those 500s against a healthy backend. :func:`check_tool_calls` refuses them first, with a
400 whose ``param`` names the field; what llama-server serves (an unknown ``tool_choice``
function, a tool result without its call, an empty name, ``tool_calls: null``) passes.

Measured against the pinned build on SmolLM2's and Gemma 3's templates and on Qwen3's,
Qwen3-Coder's and Hermes 2 Pro's (see docs/api.md, "Tool-call mistakes").
"""

from __future__ import annotations

from typing import Any

from slm_server.errors import InvalidRequest
from slm_server.router.intake import strict_json
from slm_server.router.intake.tool_schema import check_schema

# Message fields llama-server reads as strings whenever they are present (null included).
STRING_FIELDS = ("role", "name", "tool_call_id", "reasoning_content")


def check_tool_calls(payload: dict[str, Any]) -> None:
    """Refuse (400 naming the field) what llama-server fails on with a 500 in a chat
    completions request's ``messages`` (their tool calls, tool results, names and text
    parts) and ``tools``."""
    messages = payload.get("messages")
    if isinstance(messages, list):
        for index, message in enumerate(messages):
            if isinstance(message, dict):
                _message(message, f"messages[{index}]")
    tools = payload.get("tools")
    if tools is not None:
        _tools(tools)


def check_chat_tool_calls(payload: dict[str, Any], _model_type: str) -> None:
    """:func:`check_tool_calls` as a check of a chat completions request's shape."""
    check_tool_calls(payload)


def check_arguments(arguments: Any, param: str) -> None:
    """Refuse a tool call's ``arguments`` that are not a JSON object: as JSON text (what
    OpenAI's API sends) or as the object itself; ``null`` either way is served."""
    value = arguments
    if isinstance(arguments, str):
        try:
            value = strict_json.loads(arguments.encode("utf-8"))
        except InvalidRequest as error:
            raise InvalidRequest(
                f"`{param}` must be a JSON object encoded as a string; it is not JSON "
                f"({error.message})",
                param=param,
            ) from None
    if value is not None and not isinstance(value, dict):
        raise InvalidRequest(
            f"`{param}` must be a JSON object (encoded as a string), not {_kind(value)}",
            param=param,
        )


def _message(message: dict[str, Any], path: str) -> None:
    if "role" not in message:
        raise InvalidRequest(f"`{path}.role` is required", param=f"{path}.role")
    for field in STRING_FIELDS:
        if field in message and not isinstance(message[field], str):
            raise InvalidRequest(
                f"`{path}.{field}` must be a string, not {_kind(message[field])}",
                param=f"{path}.{field}",
            )
    content = message.get("content")
    if isinstance(content, list):
        for index, part in enumerate(content):
            text = part.get("text") if isinstance(part, dict) else ""
            if isinstance(part, dict) and part.get("type") == "text" and not isinstance(text, str):
                where = f"{path}.content[{index}].text"
                raise InvalidRequest(f"`{where}` must be a string", param=where)
    calls = message.get("tool_calls")
    if calls is None:
        return
    if not isinstance(calls, list):
        raise InvalidRequest(
            f"`{path}.tool_calls` must be a list, not {_kind(calls)}", param=f"{path}.tool_calls"
        )
    for index, call in enumerate(calls):
        _call(call, f"{path}.tool_calls[{index}]")


def _call(call: Any, path: str) -> None:
    if not isinstance(call, dict):
        raise InvalidRequest(f"`{path}` must be an object", param=path)
    if call.get("type") != "function":
        raise InvalidRequest(f'`{path}.type` must be "function"', param=f"{path}.type")
    if "id" in call and not isinstance(call["id"], str):
        raise InvalidRequest(
            f"`{path}.id` must be a string, not {_kind(call['id'])}", param=f"{path}.id"
        )
    function = call.get("function")
    if not isinstance(function, dict):
        raise InvalidRequest(
            f"`{path}.function` must be an object with a name and arguments",
            param=f"{path}.function",
        )
    if not isinstance(function.get("name"), str):
        raise InvalidRequest(
            f"`{path}.function.name` must be a string", param=f"{path}.function.name"
        )
    if "arguments" not in function:
        raise InvalidRequest(
            f"`{path}.function.arguments` is required (a JSON object encoded as a string)",
            param=f"{path}.function.arguments",
        )
    check_arguments(function["arguments"], f"{path}.function.arguments")


def _tools(tools: Any) -> None:
    if not isinstance(tools, list):
        raise InvalidRequest(f"`tools` must be a list, not {_kind(tools)}", param="tools")
    for index, tool in enumerate(tools):
        path = f"tools[{index}]"
        if not isinstance(tool, dict):
            raise InvalidRequest(f"`{path}` must be an object", param=path)
        if tool.get("type") != "function":
            raise InvalidRequest(
                f'`{path}.type` must be "function" (chat completions tools are '
                '{"type": "function", "function": {"name": ..., "parameters": ...}})',
                param=f"{path}.type",
            )
        function = tool.get("function")
        if not isinstance(function, dict):
            raise InvalidRequest(
                f"`{path}.function` must be an object with a name", param=f"{path}.function"
            )
        if not isinstance(function.get("name"), str):
            raise InvalidRequest(
                f"`{path}.function.name` must be a string", param=f"{path}.function.name"
            )
        if "description" in function and not isinstance(function["description"], str):
            raise InvalidRequest(
                f"`{path}.function.description` must be a string, not "
                f"{_kind(function['description'])}",
                param=f"{path}.function.description",
            )
        check_schema(function.get("parameters"), f"{path}.function.parameters")


def _kind(value: Any) -> str:
    """How a JSON value is named in a refusal."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


__all__ = ["check_arguments", "check_chat_tool_calls", "check_tool_calls"]
