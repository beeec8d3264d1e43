"""What a chat completions request offers the model to call, and what it requires of it.
Pure.

:func:`offer_of` reads a request's ``tools`` (already checked by
:mod:`slm_server.router.intake.tool_calls`) and ``tool_choice``: each offered function's
name, description and ``parameters`` schema, and whether the answer may call one
(``auto``), must not (``none``), must call one (``required``), or must call the one
named (``{"type": "function", "function": {"name": ...}}``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Choice = Literal["auto", "none", "required", "named"]


@dataclass(frozen=True, slots=True)
class Tool:
    """One offered function."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Offer:
    """The tools of one request and its choice; ``named`` is the one function a named
    choice requires."""

    tools: tuple[Tool, ...]
    choice: Choice
    named: str | None = None
    parallel: bool = True  # several calls in one answer (``parallel_tool_calls``)

    @property
    def schemas(self) -> dict[str, Any]:
        """Each offered name to its parameters schema (what a call is checked against)."""
        return {tool.name: tool.parameters for tool in self.tools}

    @property
    def forced(self) -> bool:
        """Whether the answer must be a call."""
        return self.choice in ("required", "named")

    def required(self) -> tuple[Tool, ...]:
        """The tools a forced answer may call: the named one, or every one."""
        if self.choice == "named":
            return tuple(tool for tool in self.tools if tool.name == self.named)
        return self.tools

    def only(self, name: str) -> Offer:
        """This offer forced to call ``name``."""
        return Offer(self.tools, "named", name, self.parallel)


def offer_of(chat: dict[str, Any]) -> Offer | None:
    """The request's offer; None when it offers no function (or a named choice names
    one it does not offer: the backend's to answer, as it always was)."""
    tools = chat.get("tools")
    if not isinstance(tools, list) or not tools:
        return None
    offered: list[Tool] = []
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            continue
        parameters = function.get("parameters")
        description = function.get("description")
        offered.append(
            Tool(
                function["name"],
                description if isinstance(description, str) else "",
                parameters if isinstance(parameters, dict) else {},
            )
        )
    if not offered:
        return None
    parallel = chat.get("parallel_tool_calls") is not False
    choice = chat.get("tool_choice", "auto")
    if choice in ("auto", "none", "required"):
        return Offer(tuple(offered), choice, None, parallel)
    if isinstance(choice, dict):
        function = choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if isinstance(name, str) and any(tool.name == name for tool in offered):
            return Offer(tuple(offered), "named", name, parallel)
        return None
    return Offer(tuple(offered), "auto", None, parallel)


__all__ = ["Choice", "Offer", "Tool", "offer_of"]
