"""A call the request requires, enforced by the backend's constrained decoding. Pure.

A forced answer (``tool_choice`` ``required`` or a named function) is asked of the
backend as a JSON object ``{"name": ..., "arguments": {...}}`` under
``response_format: {"type": "json_schema"}`` (llama-server turns it into a grammar;
other OpenAI-compatible servers take the same field): one branch per tool it may call,
its ``name`` that tool's and its ``arguments`` that tool's ``parameters``. The model
then cannot answer anything but a call to an offered tool; the router makes the JSON a
call (:func:`forced_call`) and checks it like any other.
"""

from __future__ import annotations

import json
from typing import Any, Final

from slm_server.router.toolcalls.offer import Offer, Tool

SCHEMA_NAME: Final = "tool_call"
# llama-server's DRY sampler on a forced call, unless the request sets its own: a small
# model under a grammar repeats an array's items or a string's words until its tokens
# run out (Gemma 3 270M: 11 of 100 forced calls at the pin; 7 with it).
LOOP_BREAKER: Final = {"dry_multiplier": 0.8}

# The JSON Schema keywords llama.cpp's grammar conversion reads; a tool whose
# parameters use others (or none at all) is constrained to an object and checked after.
_KNOWN: Final = frozenset(
    {
        "type",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "prefixItems",
        "enum",
        "const",
        "anyOf",
        "oneOf",
        "allOf",
        "$ref",
        "$defs",
        "definitions",
        "minItems",
        "maxItems",
        "minLength",
        "maxLength",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "description",
        "title",
        "default",
        "examples",
        "$schema",
        "$id",
        "format",
        "pattern",
        "nullable",
        "strict",
    }
)


def call_schema(offer: Offer) -> dict[str, Any]:
    """The JSON Schema of a call to one of the tools ``offer`` forces."""
    branches = [_branch(tool) for tool in offer.required()]
    return branches[0] if len(branches) == 1 else {"anyOf": branches}


def constrain(
    chat: dict[str, Any], offer: Offer, sampling: dict[str, Any] | None = None
) -> dict[str, Any]:
    """``chat`` asking for a call under the schema (a new request), with ``sampling``
    where the request set none of its own (:data:`LOOP_BREAKER`)."""
    forced = {k: v for k, v in chat.items() if k not in ("response_format", "json_schema")}
    forced.pop("grammar", None)
    for name, value in (sampling or {}).items():
        forced.setdefault(name, value)
    forced["response_format"] = {
        "type": "json_schema",
        "json_schema": {"name": SCHEMA_NAME, "schema": call_schema(offer), "strict": True},
    }
    return forced


def forced_call(text: str) -> tuple[str, Any] | None:
    """The call in a forced answer's text: its name and arguments; None when the text
    is not such an object (a backend that ignored the schema)."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    return value["name"], value.get("arguments", {})


def _branch(tool: Tool) -> dict[str, Any]:
    convertible = _convertible(tool.parameters)
    arguments = _closed(tool.parameters) if convertible else {"type": "object"}
    if not arguments:
        arguments = {"type": "object"}
    return {
        "type": "object",
        "properties": {"name": {"const": tool.name}, "arguments": arguments},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def _closed(schema: Any) -> Any:
    """``schema`` with every object that lists its properties and says nothing of others
    closed to them (``additionalProperties: false``, as OpenAI's strict mode does): a
    small model under a grammar that lets it add properties loops in one until its
    tokens run out. (Not inside ``allOf``, whose branches would then refuse each
    other's properties.)"""
    if not isinstance(schema, dict):
        return schema
    closed: dict[str, Any] = {}
    for key, value in schema.items():
        if key in ("properties", "$defs", "definitions") and isinstance(value, dict):
            closed[key] = {name: _closed(part) for name, part in value.items()}
        elif key in ("anyOf", "oneOf", "prefixItems") and isinstance(value, list):
            closed[key] = [_closed(part) for part in value]
        elif key == "items":
            closed[key] = _closed(value)
        else:
            closed[key] = value
    if isinstance(schema.get("properties"), dict) and "additionalProperties" not in schema:
        closed["additionalProperties"] = False
    return closed


def _convertible(schema: Any, depth: int = 0) -> bool:
    """Whether the grammar conversion reads every keyword of ``schema``."""
    if depth > 32:
        return False
    if isinstance(schema, bool):
        return True
    if not isinstance(schema, dict):
        return False
    for key, value in schema.items():
        if key not in _KNOWN:
            return False
        if key in ("properties", "$defs", "definitions"):
            parts = list(value.values()) if isinstance(value, dict) else None
        elif key in ("anyOf", "oneOf", "allOf", "prefixItems"):
            parts = value if isinstance(value, list) else None
        elif key in ("items", "additionalProperties"):
            parts = [value]
        else:
            continue
        if parts is None or not all(_convertible(v, depth + 1) for v in parts):
            return False
    return True


__all__ = ["LOOP_BREAKER", "SCHEMA_NAME", "call_schema", "constrain", "forced_call"]
