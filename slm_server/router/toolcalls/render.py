"""The offered tools written into the prompt by the router, for a model whose chat
template does not take them, and the conversation's earlier calls and results written
as the same text. Pure.

The form (documented in ``docs/api.md``, "Tool calls"): the tools as one compact JSON
object per line between ``<tools>`` and ``</tools>``, and a call as a JSON object with
its ``name`` and ``arguments`` between ``<tool_call>`` and ``</tool_call>`` — the form
many small models were tuned on (Hermes, SmolLM2, Qwen). The text goes at the end of
the first system message (one is made when there is none). An assistant turn's
``tool_calls`` become that text in its content, and each ``tool`` result a user turn's
``<tool_response>`` (consecutive results one turn), since such a template knows no
other roles. The request goes without ``tools``, ``tool_choice`` and
``parallel_tool_calls``: the backend sees plain text.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any, Final

from slm_server.router.toolcalls.offer import Offer, Tool

OPEN: Final = "<tool_call>"
CLOSE: Final = "</tool_call>"

# The request fields that say what the backend's template does with tools.
TOOL_FIELDS: Final = ("tools", "tool_choice", "parallel_tool_calls")

_PREAMBLE: Final = (
    "# Tools\n\n"
    "You may call one or more of these functions to answer the user. Each is described "
    "by a JSON object on its own line:\n<tools>\n"
)
_HOW: Final = (
    "</tools>\n\n"
    "To call a function, write a JSON object with its name and its arguments (which "
    "follow its parameters schema) between <tool_call> and </tool_call>, one per call:\n"
    '<tool_call>\n{"name": "<function name>", "arguments": {<arguments>}}\n</tool_call>'
)
_MUST: Final = "\n\nAnswer with a function call now, and nothing else."
_ONE: Final = "\n\nCall at most one function in your answer."
_MUST_NAMED: Final = "\n\nAnswer with a call to the function {name} now, and nothing else."


def tools_text(offer: Offer) -> str:
    """The system text that offers ``offer``'s tools and says how to call them."""
    lines = "".join(_describe(tool) + "\n" for tool in offer.tools)
    text = _PREAMBLE + lines + _HOW
    if not offer.parallel:
        text += _ONE
    if offer.choice == "required":
        text += _MUST
    elif offer.choice == "named":
        text += _MUST_NAMED.format(name=offer.named)
    return text


def render_request(chat: dict[str, Any], offer: Offer) -> dict[str, Any]:
    """``chat`` as the backend is sent it with the tools in its prompt: a new request
    (``chat`` is not changed)."""
    rendered = {key: value for key, value in chat.items() if key not in TOOL_FIELDS}
    messages = chat.get("messages")
    turns = _turns(messages if isinstance(messages, list) else [])
    rendered["messages"] = (
        turns if offer.choice == "none" else _with_system(turns, tools_text(offer))
    )
    return rendered


def call_text(name: str, arguments: Any) -> str:
    """One call as the rendered form writes it (``arguments`` a JSON string or an
    object)."""
    if isinstance(arguments, str):
        with contextlib.suppress(ValueError):
            arguments = json.loads(arguments)
    return f"{OPEN}\n{_dumps({'name': name, 'arguments': arguments})}\n{CLOSE}"


def _describe(tool: Tool) -> str:
    described: dict[str, Any] = {"name": tool.name}
    if tool.description:
        described["description"] = tool.description
    described["parameters"] = tool.parameters or {"type": "object", "properties": {}}
    return _dumps(described)


def _turns(messages: list[Any]) -> list[Any]:
    """The messages with calls and results as text (new turns; the client's are not
    changed)."""
    names: dict[str, str] = {}  # a call's id to its function's name
    turns: list[Any] = []
    results_at: int | None = None  # the index of the turn of results being written
    for message in messages:
        if not isinstance(message, dict):
            turns.append(message)
            results_at = None
            continue
        role = message.get("role")
        if role == "tool":
            response = _response(message, names)
            if results_at is not None:
                turns[results_at] = {
                    "role": "user",
                    "content": f"{turns[results_at]['content']}\n{response}",
                }
            else:
                results_at = len(turns)
                turns.append({"role": "user", "content": response})
            continue
        results_at = None
        if role == "assistant" and message.get("tool_calls"):
            turns.append(_assistant(message, names))
        else:
            turns.append(message)
    return turns


def _assistant(message: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    calls: list[str] = []
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            continue
        name = function.get("name", "")
        if isinstance(call.get("id"), str):
            names[call["id"]] = name
        calls.append(call_text(name, function.get("arguments")))
    text = _text(message.get("content"))
    content = "\n".join(([text] if text else []) + calls)
    kept = {k: v for k, v in message.items() if k not in ("tool_calls", "content")}
    return {**kept, "content": content}


def _response(message: dict[str, Any], names: dict[str, str]) -> str:
    result: dict[str, Any] = {}
    name = names.get(message.get("tool_call_id") or "") or message.get("name")
    if name:
        result["name"] = name
    result["content"] = _text(message.get("content"))
    return f"<tool_response>\n{_dumps(result)}\n</tool_response>"


def _with_system(turns: list[Any], text: str) -> list[Any]:
    first = turns[0] if turns else None
    if isinstance(first, dict) and first.get("role") in ("system", "developer"):
        own = _text(first.get("content"))
        merged = {**first, "role": "system", "content": f"{own}\n\n{text}" if own else text}
        return [merged, *turns[1:]]
    return [{"role": "system", "content": text}, *turns]


def _text(content: Any) -> str:
    """A message's text: its string, or its text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, dict)
            and part.get("type") == "text"
            and isinstance(part.get("text"), str)
        )
    return ""


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


__all__ = ["CLOSE", "OPEN", "TOOL_FIELDS", "call_text", "render_request", "tools_text"]
