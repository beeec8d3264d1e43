"""A Messages request's tools and its ``tool_choice`` as chat completions functions,
checked (400 naming the field for what a local model cannot serve). Pure."""

from __future__ import annotations

from typing import Any

from slm_server.errors import InvalidRequest
from slm_server.router.intake.tool_schema import check_schema


def chat_tools(tools: Any) -> list[dict[str, Any]]:
    """The Messages ``tools`` (client tools: a name, a description, an ``input_schema``)
    as chat completions functions."""
    if not isinstance(tools, list):
        raise InvalidRequest("`tools` must be a list", param="tools")
    converted: list[dict[str, Any]] = []
    for index, tool in enumerate(tools):
        path = f"tools[{index}]"
        if not isinstance(tool, dict):
            raise InvalidRequest(f"`{path}` must be an object", param=path)
        kind = tool.get("type")
        if kind not in (None, "custom"):
            raise InvalidRequest(
                f"tool type {kind!r} is not supported: only client tools (a name, a "
                "description and an input_schema) can be served by a local model",
                param=f"{path}.type",
            )
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidRequest(f"`{path}.name` must be a non-empty string", param=f"{path}.name")
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            raise InvalidRequest(
                f"`{path}.input_schema` must be a JSON schema object",
                param=f"{path}.input_schema",
            )
        check_schema(schema, f"{path}.input_schema")
        function: dict[str, Any] = {"name": name, "parameters": schema}
        description = tool.get("description")
        if description is not None:
            if not isinstance(description, str):
                raise InvalidRequest(
                    f"`{path}.description` must be a string", param=f"{path}.description"
                )
            function["description"] = description
        converted.append({"type": "function", "function": function})
    return converted


def chat_tool_choice(choice: Any, chat: dict[str, Any]) -> None:
    """The Messages ``tool_choice`` set on ``chat`` as chat completions says it (``any``:
    ``required``; a named tool: that function), with ``disable_parallel_tool_use``."""
    kind = choice.get("type") if isinstance(choice, dict) else None
    if not isinstance(choice, dict) or kind not in ("auto", "any", "tool", "none"):
        raise InvalidRequest(
            "`tool_choice.type` must be auto, any, tool or none", param="tool_choice.type"
        )
    if kind == "tool":
        name = choice.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidRequest("`tool_choice.name` must name a tool", param="tool_choice.name")
        chat["tool_choice"] = {"type": "function", "function": {"name": name}}
    else:
        chat["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[kind]
    disable = choice.get("disable_parallel_tool_use")
    if disable is not None and not isinstance(disable, bool):
        raise InvalidRequest(
            "`tool_choice.disable_parallel_tool_use` must be a boolean",
            param="tool_choice.disable_parallel_tool_use",
        )
    if disable:
        chat["parallel_tool_calls"] = False


__all__ = ["chat_tool_choice", "chat_tools"]
