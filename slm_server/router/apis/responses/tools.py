"""The Responses API's tools as a chat model is offered them, and its calls mapped back.

A chat completions backend knows one kind of tool, the function. :func:`offer_tools`
turns a Responses ``tools`` list into chat function tools:

* ``function`` tools as they are (in the nested chat shape);
* ``custom`` (freeform) tools as a function of one string argument, ``input``
  (:mod:`.custom_input` reads it back);
* ``namespace`` tools as their member functions and custom tools, each named
  ``<namespace>__<name>`` (:func:`chat_name`), a name any chat backend accepts;
* hosted tools that only OpenAI's servers run (``HOSTED_TOOLS``: web search, file
  search, code interpreter, image generation, computer use, remote MCP, tool search,
  programmatic tool calling) are left out, and their types reported as ``dropped``;
* the client-run built-ins whose calls have item types of their own (``local_shell``,
  ``shell``, ``apply_patch``) are refused: the gateway does not produce those items.

Deferred tools (``defer_loading``) are offered like the others: the tool search that
would load them is one of the hosted tools left out. A chat tool call is mapped back
by its function name (:meth:`ToolOffer.ref`) to the Responses tool it stands for.
Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final, Literal

from slm_server.errors import InvalidRequest
from slm_server.router.intake.tool_schema import check_schema

HOSTED_TOOLS: Final = frozenset(
    {
        "web_search",
        "web_search_2025_08_26",
        "web_search_preview",
        "web_search_preview_2025_03_11",
        "file_search",
        "code_interpreter",
        "image_generation",
        "computer",
        "computer_use",
        "computer_use_preview",
        "mcp",
        "tool_search",
        "programmatic_tool_calling",
    }
)
CLIENT_BUILTINS: Final = frozenset({"local_shell", "shell", "apply_patch"})
NAMESPACE_SEPARATOR: Final = "__"
TOOL_CHOICE_MODES: Final = frozenset({"auto", "none", "required"})
# The one argument a custom tool's stand-in function takes.
CUSTOM_INPUT: Final = "input"

Kind = Literal["function", "custom"]


def chat_name(name: str, namespace: str | None = None) -> str:
    """The chat function name of a Responses tool (``<namespace>__<name>`` in a namespace)."""
    return f"{namespace}{NAMESPACE_SEPARATOR}{name}" if namespace else name


@dataclass(frozen=True, slots=True)
class ToolRef:
    """The Responses tool a chat function stands for."""

    kind: Kind
    name: str
    namespace: str | None = None


@dataclass
class ToolOffer:
    """What the chat model is offered for one request's ``tools``.

    ``chat_tools`` are the chat function tools, ``refs`` maps each one's name back to
    the Responses tool, and ``dropped`` lists the hosted tool types left out, in order,
    each once.
    """

    chat_tools: list[dict[str, Any]] = field(default_factory=list)
    refs: dict[str, ToolRef] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)

    def ref(self, function_name: str) -> ToolRef:
        """The Responses tool a chat call of ``function_name`` is for (a plain function
        when the request offered none by that name)."""
        return self.refs.get(function_name) or ToolRef("function", function_name)

    def _add(self, ref: ToolRef, function: dict[str, Any], path: str) -> None:
        name = function["name"]
        if name in self.refs:
            raise InvalidRequest(
                f"`{path}.name`: a tool named {name!r} is offered twice "
                f"(a namespace's tools are offered as `<namespace>{NAMESPACE_SEPARATOR}<name>`)",
                param=f"{path}.name",
            )
        self.refs[name] = ref
        self.chat_tools.append({"type": "function", "function": function})


def offer_tools(tools: Any) -> ToolOffer:
    """The chat tools for a Responses ``tools`` list; raises :class:`InvalidRequest`
    naming the field for a tool that cannot be offered."""
    offer = ToolOffer()
    if tools is None:
        return offer
    if not isinstance(tools, list):
        raise InvalidRequest("`tools` must be a list", param="tools")
    for index, tool in enumerate(tools):
        path = f"tools[{index}]"
        if not isinstance(tool, dict):
            raise InvalidRequest(f"`{path}` must be an object", param=path)
        kind = tool.get("type")
        if kind in HOSTED_TOOLS:
            if kind not in offer.dropped:
                offer.dropped.append(kind)
        elif kind == "namespace":
            _offer_namespace(offer, tool, path)
        elif kind in ("function", "custom"):
            _offer_one(offer, tool, path, None)
        elif kind in CLIENT_BUILTINS:
            raise InvalidRequest(
                f"tool type {kind!r} is not supported: the gateway cannot produce its "
                "calls; offer it as a function or custom tool",
                param=f"{path}.type",
            )
        else:
            raise InvalidRequest(
                f"tool type {kind!r} is not supported; expected function, custom, "
                "namespace or a hosted tool (which is left out)",
                param=f"{path}.type",
            )
    return offer


def echoed_tools(tools: Any) -> list[Any]:
    """The request's ``tools`` as a response echoes them: without the hosted tools left
    out (the model could not call them; ``x-slm-dropped-tools`` names them)."""
    if not isinstance(tools, list):
        return []
    return [t for t in tools if not (isinstance(t, dict) and t.get("type") in HOSTED_TOOLS)]


def offer_of(request: dict[str, Any]) -> ToolOffer:
    """The offer made for ``request`` (a translated one: its tools were checked), for
    mapping its answer's calls back; an empty offer for tools that cannot be offered."""
    try:
        return offer_tools(request.get("tools"))
    except InvalidRequest:
        return ToolOffer()


def _offer_namespace(offer: ToolOffer, tool: dict[str, Any], path: str) -> None:
    namespace = tool.get("name")
    if not isinstance(namespace, str) or not namespace:
        raise InvalidRequest(f"`{path}.name` must be a non-empty string", param=f"{path}.name")
    members = tool.get("tools")
    if not isinstance(members, list):
        raise InvalidRequest(f"`{path}.tools` must be a list", param=f"{path}.tools")
    for index, member in enumerate(members):
        where = f"{path}.tools[{index}]"
        if not isinstance(member, dict):
            raise InvalidRequest(f"`{where}` must be an object", param=where)
        if member.get("type") not in ("function", "custom"):
            raise InvalidRequest(
                f"a namespace holds function and custom tools, not {member.get('type')!r}",
                param=f"{where}.type",
            )
        _offer_one(offer, member, where, namespace)


def _offer_one(offer: ToolOffer, tool: dict[str, Any], path: str, namespace: str | None) -> None:
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidRequest(
            f"`{path}.name` is required (Responses tools are flat: "
            '{"type": "function", "name": ..., "parameters": ...})',
            param=f"{path}.name",
        )
    function: dict[str, Any] = {"name": chat_name(name, namespace)}
    if tool["type"] == "function":
        description = tool.get("description")
        if description is not None and not isinstance(description, str):
            raise InvalidRequest(
                f"`{path}.description` must be a string", param=f"{path}.description"
            )
        check_schema(tool.get("parameters"), f"{path}.parameters")
        function.update(
            {k: tool[k] for k in ("description", "parameters") if tool.get(k) is not None}
        )
        offer._add(ToolRef("function", name, namespace), function, path)
        return
    description = _custom_description(tool, path)
    if description:
        function["description"] = description
    function["parameters"] = {
        "type": "object",
        "properties": {CUSTOM_INPUT: {"type": "string", "description": "The tool's input"}},
        "required": [CUSTOM_INPUT],
        "additionalProperties": False,
    }
    offer._add(ToolRef("custom", name, namespace), function, path)


def _custom_description(tool: dict[str, Any], path: str) -> str:
    """A custom tool's description, with its input format (a grammar) spelled out."""
    description = tool.get("description")
    text = description if isinstance(description, str) else ""
    fmt = tool.get("format")
    if fmt is None or (isinstance(fmt, dict) and fmt.get("type") == "text"):
        return text
    if not isinstance(fmt, dict) or fmt.get("type") != "grammar":
        raise InvalidRequest(
            "`format.type` of a custom tool must be text or grammar", param=f"{path}.format"
        )
    syntax, definition = fmt.get("syntax"), fmt.get("definition")
    if not isinstance(syntax, str) or not isinstance(definition, str):
        raise InvalidRequest(
            "a grammar format needs a `syntax` and a `definition`", param=f"{path}.format"
        )
    rule = f"The input must follow this {syntax} grammar:\n{definition}"
    return f"{text}\n\n{rule}" if text else rule


def chat_tool_choice(choice: Any, offer: ToolOffer) -> Any:
    """The chat ``tool_choice`` for a Responses one. A choice of one tool narrows
    ``offer.chat_tools`` (in place) to that tool, and ``allowed_tools`` to the tools it
    allows, under ``"required"`` or ``"auto"``: the pinned llama-server ignores a
    ``tool_choice`` that names a function. A choice that forces a tool the model is not
    offered (a hosted one, an unknown name) is refused."""
    if isinstance(choice, str) and choice in TOOL_CHOICE_MODES:
        if choice == "required" and not offer.chat_tools:
            raise InvalidRequest(
                '`tool_choice` is "required" but the model is offered no tool it can call',
                param="tool_choice",
            )
        return choice
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind in ("function", "custom") and isinstance(choice, dict):
        forced = _forced(choice, offer)
        offer.chat_tools[:] = [t for t in offer.chat_tools if t["function"]["name"] == forced]
        return "required"
    if kind == "allowed_tools" and isinstance(choice, dict):
        return _allowed_tools(choice, offer)
    raise InvalidRequest(
        '`tool_choice` must be "auto", "none", "required", {"type": "function", "name": ...}, '
        '{"type": "custom", "name": ...} or {"type": "allowed_tools", ...}; hosted tools '
        "are left out of what the model sees and cannot be forced",
        param="tool_choice",
    )


def _forced(choice: dict[str, Any], offer: ToolOffer) -> str:
    """The chat name of the tool a ``function`` or ``custom`` choice names (a
    namespace's tool as ``<namespace>.<name>``, as the openai-agents SDK qualifies it)."""
    name = choice.get("name")
    if isinstance(name, str):
        namespace, _, member = name.rpartition(".")
        for candidate in (name, chat_name(member, namespace) if namespace else None):
            ref = offer.refs.get(candidate) if candidate is not None else None
            if ref is not None and ref.kind == choice["type"]:
                return chat_name(ref.name, ref.namespace)
    raise InvalidRequest(
        f"`tool_choice.name` names no {choice['type']} tool in `tools`",
        param="tool_choice.name",
    )


def _allowed_tools(choice: dict[str, Any], offer: ToolOffer) -> Any:
    mode, allowed = choice.get("mode"), choice.get("tools")
    if mode not in ("auto", "required") or not isinstance(allowed, list):
        raise InvalidRequest(
            '`tool_choice` of type allowed_tools needs a `mode` ("auto" or "required") '
            "and a list of `tools`",
            param="tool_choice",
        )
    names: set[str] = set()
    for index, tool in enumerate(allowed):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind in ("function", "custom") and isinstance(tool, dict):
            names.add(_forced(tool, offer))
        elif kind not in HOSTED_TOOLS and kind != "namespace":
            raise InvalidRequest(
                f"allowed tool type {kind!r} is not supported",
                param=f"tool_choice.tools[{index}].type",
            )
        elif kind == "namespace" and isinstance(tool, dict):
            space = tool.get("name")
            names.update(n for n, ref in offer.refs.items() if space and ref.namespace == space)
    offer.chat_tools[:] = [t for t in offer.chat_tools if t["function"]["name"] in names]
    return chat_tool_choice(mode, offer)


__all__ = [
    "CUSTOM_INPUT",
    "HOSTED_TOOLS",
    "ToolOffer",
    "ToolRef",
    "chat_name",
    "chat_tool_choice",
    "echoed_tools",
    "offer_of",
    "offer_tools",
]
