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
from dataclasses import dataclass
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
# At most this many of a call's strings and arrays are bounded (llama.cpp writes a
# bound of 128 as 128 grammar rules): those of a tool with thousands stay open.
RETRY_MAX_BOUNDS: Final = 64


@dataclass(slots=True)
class _Budget:
    """The bounds a retry's schema may still add."""

    left: int


def call_schema(offer: Offer, *, bounded: bool = False) -> dict[str, Any]:
    """The JSON Schema of a call to one of the tools ``offer`` forces; ``bounded``: its
    open strings and arrays bounded (:data:`RETRY_CHARS`, :data:`RETRY_ITEMS`)."""
    budget = _Budget(RETRY_MAX_BOUNDS) if bounded else None
    tools = offer.required()
    if len(tools) == 1:
        return _branch(tools[0], budget, "#/properties/arguments")
    at = "#/anyOf/{}/properties/arguments"
    return {"anyOf": [_branch(t, budget, at.format(i)) for i, t in enumerate(tools)]}


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


def _branch(tool: Tool, budget: _Budget | None, at: str) -> dict[str, Any]:
    """The branch of a call to ``tool``, whose arguments sit at ``at`` in the call's
    schema."""
    arguments = _grammar(tool.parameters, 0, closing=True, budget=budget, at=at)
    if not isinstance(arguments, dict) or not arguments:
        arguments = {"type": "object"}
    return {
        "type": "object",
        "properties": {"name": {"const": tool.name}, "arguments": arguments},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def _grammar(
    schema: Any, depth: int, *, closing: bool, budget: _Budget | None = None, at: str = "#"
) -> Any:
    """What of ``schema`` goes into the grammar (:data:`_STRUCTURE`, and bounds up to
    :data:`MAX_BOUND`); every object that lists its properties and says nothing of
    others closed to them (``additionalProperties: false``, as OpenAI's strict mode
    does: a small model under a grammar that lets it add properties loops in one until
    its tokens run out) unless ``closing`` is off (inside ``allOf``, whose branches
    would refuse each other's properties); ``budget`` (a call asked again): each string
    and array without a kept upper bound given one, while it lasts (:func:`_bounded`);
    ``at``: where the parameters sit in the call's schema, each reference into their
    own document (``#``, ``#/$defs/...``) made one into the call's (llama.cpp resolves
    a ``$ref`` from the root of the schema it is sent; values, ``enum`` and ``const``,
    are copied as they are)."""
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
                n: _grammar(v, depth + 1, closing=closing, budget=budget, at=at)
                for n, v in value.items()
            }
        elif key in ("anyOf", "oneOf", "prefixItems") and isinstance(value, list):
            kept[key] = [
                _grammar(v, depth + 1, closing=closing, budget=budget, at=at) for v in value
            ]
        elif key == "allOf" and isinstance(value, list):
            kept[key] = [_grammar(v, depth + 1, closing=False, budget=budget, at=at) for v in value]
        elif key == "$ref" and isinstance(value, str) and (value == "#" or value[:2] == "#/"):
            kept[key] = at + value[1:]
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            kept[key] = _grammar(value, depth + 1, closing=closing, budget=budget, at=at)
        else:
            kept[key] = value
    if closing and isinstance(kept.get("properties"), dict) and "additionalProperties" not in kept:
        kept["additionalProperties"] = False
    return kept if budget is None else _bounded(kept, schema, budget)


def _bounded(kept: dict[str, Any], schema: dict[str, Any], budget: _Budget) -> dict[str, Any]:
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
        if kind in types and high not in kept and budget.left > 0:
            budget.left -= 1
            own, floor = schema.get(high), schema.get(low)
            if isinstance(own, int) and not isinstance(own, bool) and own >= 0:
                cap = min(cap, own)
            if isinstance(floor, int) and not isinstance(floor, bool) and floor > cap:
                cap = floor  # a lower bound the grammar left out as too large, too
            kept[high] = cap
    return kept


__all__ = ["LOOP_BREAKER", "SCHEMA_NAME", "call_schema", "constrain", "forced_call"]
