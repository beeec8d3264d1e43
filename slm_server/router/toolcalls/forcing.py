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

# What of a tool's parameters goes into the grammar: the keywords llama.cpp's
# conversion reads and cannot fail on. Every other one is left out of the grammar (a
# ``pattern`` it cannot read fails the conversion; a large bound makes the grammar as
# large), and the call is checked against the whole schema after.
_STRUCTURE: Final = frozenset(
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
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
    }
)
_BOUNDS: Final = frozenset({"minItems", "maxItems", "minLength", "maxLength"})
MAX_BOUND: Final = 64
MAX_DEPTH: Final = 32
# A call asked again (its first answer looped until its tokens ran out, or could not be
# mended) is asked under a grammar that must end: each string and array the schema
# leaves open is bounded — a call that validates, however the model loops.
RETRY_CHARS: Final = 128
RETRY_ITEMS: Final = 8


def call_schema(offer: Offer, *, bounded: bool = False) -> dict[str, Any]:
    """The JSON Schema of a call to one of the tools ``offer`` forces; ``bounded``: its
    open strings and arrays bounded (:data:`RETRY_CHARS`, :data:`RETRY_ITEMS`)."""
    branches = [_branch(tool, bounded) for tool in offer.required()]
    return branches[0] if len(branches) == 1 else {"anyOf": branches}


def constrain(
    chat: dict[str, Any],
    offer: Offer,
    sampling: dict[str, Any] | None = None,
    *,
    bounded: bool = False,
) -> dict[str, Any]:
    """``chat`` asking for a call under the schema (a new request), with ``sampling``
    where the request set none of its own (:data:`LOOP_BREAKER`); ``bounded``: under
    a grammar that must end (a call asked again)."""
    forced = {k: v for k, v in chat.items() if k not in ("response_format", "json_schema")}
    forced.pop("grammar", None)
    for name, value in (sampling or {}).items():
        forced.setdefault(name, value)
    forced["response_format"] = {
        "type": "json_schema",
        "json_schema": {
            "name": SCHEMA_NAME,
            "schema": call_schema(offer, bounded=bounded),
            "strict": True,
        },
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


def _branch(tool: Tool, bounded: bool) -> dict[str, Any]:
    arguments = _grammar(tool.parameters, 0, closing=True, bounded=bounded)
    if not isinstance(arguments, dict) or not arguments:
        arguments = {"type": "object"}
    return {
        "type": "object",
        "properties": {"name": {"const": tool.name}, "arguments": arguments},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def _grammar(schema: Any, depth: int, *, closing: bool, bounded: bool = False) -> Any:
    """What of ``schema`` goes into the grammar (:data:`_STRUCTURE`, and bounds up to
    :data:`MAX_BOUND`); every object that lists its properties and says nothing of
    others closed to them (``additionalProperties: false``, as OpenAI's strict mode
    does: a small model under a grammar that lets it add properties loops in one until
    its tokens run out) unless ``closing`` is off (inside ``allOf``, whose branches
    would refuse each other's properties); ``bounded``: every string and array without a
    kept upper bound given one (:func:`_bounded`)."""
    if isinstance(schema, bool):
        return schema
    if not isinstance(schema, dict) or depth > MAX_DEPTH:
        return {}
    kept: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _BOUNDS:
            if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_BOUND:
                kept[key] = value
        elif key not in _STRUCTURE:
            continue
        elif key in ("properties", "$defs", "definitions") and isinstance(value, dict):
            kept[key] = {
                n: _grammar(v, depth + 1, closing=closing, bounded=bounded)
                for n, v in value.items()
            }
        elif key in ("anyOf", "oneOf", "prefixItems") and isinstance(value, list):
            kept[key] = [_grammar(v, depth + 1, closing=closing, bounded=bounded) for v in value]
        elif key == "allOf" and isinstance(value, list):
            kept[key] = [_grammar(v, depth + 1, closing=False, bounded=bounded) for v in value]
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            kept[key] = _grammar(value, depth + 1, closing=closing, bounded=bounded)
        else:
            kept[key] = value
    if closing and isinstance(kept.get("properties"), dict) and "additionalProperties" not in kept:
        kept["additionalProperties"] = False
    return _bounded(kept, schema) if bounded else kept


def _bounded(kept: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """``kept`` with an upper bound on its length where it is a string or an array
    without one: the cap, or the schema's own bound where that is lower (one too large
    for the grammar), but never under the lower bound — a value the schema allows,
    never one that goes on until the tokens run out. A value of a fixed set (``enum``,
    ``const``) is already bounded."""
    if "enum" in kept or "const" in kept:
        return kept
    types = kept.get("type")
    types = types if isinstance(types, list) else [types]
    for kind, low, high, cap in (
        ("string", "minLength", "maxLength", RETRY_CHARS),
        ("array", "minItems", "maxItems", RETRY_ITEMS),
    ):
        if kind in types and high not in kept:
            own = schema.get(high)
            if isinstance(own, int) and not isinstance(own, bool) and own >= 0:
                cap = min(cap, own)
            kept[high] = max(cap, kept.get(low, 0))
    return kept


__all__ = ["LOOP_BREAKER", "SCHEMA_NAME", "call_schema", "constrain", "forced_call"]
