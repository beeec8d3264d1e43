"""One tool call a model made, checked against the tools the request offered, and
repaired where the repair loses nothing. Pure.

:func:`check_call` takes the call's tool name and its arguments as the model wrote them
(OpenAI's ``arguments`` string, or an object) and the offered tools (name to
``parameters`` schema) and answers:

* :class:`Valid` — the name is offered and the arguments are a JSON object that
  validates against its schema: the arguments exactly as written, byte for byte;
* :class:`Repaired` — the name and arguments made valid, each repair named: the offered
  name the model misspelled, when exactly one is close (``name``); arguments that were
  not JSON (markdown fences, single quotes, trailing commas, Python's ``True``, a cut-off
  object), mended by ``json_repair`` (``arguments_json``); values coerced where the schema
  says so and nothing is lost (``"3"`` to ``3`` for an integer, a lone value into a
  one-item array), by ``json_repair``'s schema mode (``arguments_schema``); the result
  always validated by ``jsonschema``;
* :class:`Unrepairable` — why not: no offered tool by that name or close to it, no
  object to be had, or arguments that still do not validate (a required field missing,
  a value outside its enum...).
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import json
import math
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import json_repair
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, best_match

# How alike a misspelled name must be to an offered one (difflib's ratio), and by how
# much the closest must beat the next for the choice to be unambiguous.
NAME_CUTOFF: Final = 0.8
NAME_MARGIN: Final = 0.1
# Arguments longer than this that are not JSON are not mended (the repair's time grows
# faster than their length, on the event loop): the call is asked again instead.
MAX_REPAIR_CHARS: Final = 16 * 1024
# Names longer than this are not matched to an offered one, nor are names among more
# offered tools than this (difflib against each, on the event loop).
MAX_NAME_CHARS: Final = 128
MAX_FUZZY_TOOLS: Final = 256
# Schemas longer than this (as JSON) are not kept for the next call.
MAX_CACHED_SCHEMA_CHARS: Final = 256 * 1024


@dataclass(frozen=True, slots=True)
class Valid:
    """A call that needed nothing: its arguments as written."""

    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class Repaired:
    """A call made valid: its name, its arguments serialised, and what was repaired
    (``name``, ``arguments_json``, ``arguments_schema``)."""

    name: str
    arguments: str
    repairs: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Unrepairable:
    """A call that cannot be made valid, and why."""

    name: str
    reason: str


Checked = Valid | Repaired | Unrepairable


def check_call(name: str, arguments: Any, tools: Mapping[str, Any]) -> Checked:
    """``name`` called with ``arguments`` (a JSON string, or already an object) checked
    against ``tools`` (each offered tool's name to its ``parameters`` schema; None or
    ``{}`` for a tool without parameters). A tool whose parameters cannot be checked
    (not a JSON Schema, a ``$ref`` that does not resolve) takes any object."""
    repairs: list[str] = []
    offered = _offered_name(name, tools)
    if offered is None:
        return Unrepairable(name, f"no offered tool is named {name[:64]!r}")
    if offered != name:
        repairs.append("name")
    schema = tools[offered] or {}
    valid = _checker(schema)
    if isinstance(arguments, str) and not arguments.strip():
        arguments = {}  # no arguments at all: several servers send "" for a call without
        repairs.append("arguments_json")
    parsed = _parsed(arguments)
    if isinstance(parsed, dict) and valid(parsed):
        if isinstance(arguments, str):
            if not repairs:
                return Valid(offered, arguments)
            return Repaired(offered, arguments, tuple(repairs))  # only the name mended
        return Repaired(offered, _dumps(parsed), tuple(repairs))
    text = arguments if isinstance(arguments, str) else _dumps(arguments)
    if len(text) > MAX_REPAIR_CHARS and not isinstance(parsed, dict):
        return Unrepairable(
            offered, f"the arguments are not JSON, and too long to mend ({len(text)} characters)"
        )
    if not isinstance(parsed, dict):
        mended = _mend(text, None)
        if not isinstance(mended, dict):
            return Unrepairable(offered, "the arguments are not a JSON object")
        repairs.append("arguments_json")
        parsed = mended
        if valid(parsed):
            return Repaired(offered, _dumps(parsed), tuple(repairs))
    coerced = _mend(_dumps(parsed), schema) if schema and len(text) <= MAX_REPAIR_CHARS else None
    if isinstance(coerced, dict) and _unicode(coerced) and valid(coerced):
        return Repaired(offered, _dumps(coerced), (*repairs, "arguments_schema"))
    return Unrepairable(offered, _first_error(schema, parsed))


def _offered_name(name: str, tools: Mapping[str, Any]) -> str | None:
    """``name`` when offered; else the one offered name that is the same but for case,
    or clearly the closest; None when there is none, or no clear one."""
    if name in tools:
        return name
    if len(name) > MAX_NAME_CHARS or len(tools) > MAX_FUZZY_TOOLS:
        return None
    folded = [offered for offered in tools if offered.casefold() == name.casefold()]
    if len(folded) == 1:
        return folded[0]
    scored = sorted(
        ((difflib.SequenceMatcher(None, name, offered).ratio(), offered) for offered in tools),
        reverse=True,
    )
    if not scored or scored[0][0] < NAME_CUTOFF:
        return None
    if len(scored) > 1 and scored[0][0] - scored[1][0] < NAME_MARGIN:
        return None  # two names as close: not the router's to choose
    return scored[0][1]


_VALIDATORS: OrderedDict[str, Draft202012Validator | None] = OrderedDict()
MAX_CACHED_VALIDATORS: Final = 64


def _cached_validator(digest: str, text: str) -> Draft202012Validator | None:
    """The validator for ``text`` kept under its ``digest``, the least recently used
    dropped past :data:`MAX_CACHED_VALIDATORS`."""
    if digest in _VALIDATORS:
        _VALIDATORS.move_to_end(digest)
        return _VALIDATORS[digest]
    validator = _VALIDATORS[digest] = _validator_of(text)
    if len(_VALIDATORS) > MAX_CACHED_VALIDATORS:
        _VALIDATORS.popitem(last=False)
    return validator


def _validator_of(text: str) -> Draft202012Validator | None:
    try:
        schema = json.loads(text)
        Draft202012Validator.check_schema(schema)
    except (SchemaError, ValueError, RecursionError):
        return None
    return Draft202012Validator(schema)


def _validator(schema: Any) -> Draft202012Validator | None:
    """The validator of ``schema`` (kept, by its digest, for the schemas seen last: an
    agent offers the same tools on every turn; a very large one is built each time);
    None when it is not a JSON Schema."""
    if not isinstance(schema, dict):
        return None
    try:
        text = json.dumps(schema, sort_keys=True)
    except (TypeError, ValueError, RecursionError):
        return None
    if len(text) > MAX_CACHED_SCHEMA_CHARS:
        return _validator_of(text)
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    return _cached_validator(digest, text)


def _checker(schema: Any) -> Callable[[Any], bool]:
    """Whether an instance validates against ``schema``; where ``schema`` cannot be
    used (not a JSON Schema, a reference that does not resolve), whether it is an
    object of JSON."""
    validator = _validator(schema)

    def valid(instance: Any) -> bool:
        if not isinstance(instance, dict) or not _unicode(instance):
            return False
        if validator is None:
            return True
        try:
            return bool(validator.is_valid(instance))
        except Exception:  # a schema jsonschema cannot follow: unchecked
            return True

    return valid


def _parsed(arguments: Any) -> Any:
    """The arguments as JSON, strictly (no ``NaN`` or ``Infinity``, which no JSON
    parser downstream takes); None when they are not."""
    if not isinstance(arguments, str):
        return arguments
    try:
        return json.loads(arguments, parse_constant=_refuse)
    except (ValueError, RecursionError):
        return None


def _refuse(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


def _unicode(value: Any) -> bool:
    """Whether ``value`` serialises as UTF-8 (no lone surrogate escapes) and holds no
    ``NaN`` or infinity."""
    try:
        json.dumps(value, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except (ValueError, UnicodeEncodeError, RecursionError, TypeError):
        return False
    return True


def _mend(text: str, schema: Any) -> Any:
    """``text`` repaired: as a Python literal first (``True``, ``None``, single quotes:
    exactly what was meant), else by ``json_repair`` (against ``schema`` when given: its
    lossless coercions); None when it cannot be."""
    if schema is None:
        literal = _literal(text)
        if literal is not None:
            return literal
    try:
        if schema:
            mended = json_repair.repair_json(text, return_objects=True, schema=schema)
        else:
            mended = json_repair.repair_json(text, return_objects=True)
    except (ValueError, TypeError, RecursionError):
        return None
    return mended if _unicode(mended) else None


def _literal(text: str) -> dict[str, Any] | None:
    """``text`` as a Python dict literal of JSON's kinds of value; None otherwise."""
    stripped = text.strip()
    if not stripped.startswith("{"):
        return None
    try:
        value = ast.literal_eval(stripped)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    json_value = _as_json(value)
    return json_value if isinstance(json_value, dict) else None


def _as_json(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else _NOT_JSON
    if isinstance(value, list | tuple):
        items = [_as_json(item) for item in value]
        return _NOT_JSON if any(item is _NOT_JSON for item in items) else items
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        pairs = {key: _as_json(item) for key, item in value.items()}
        return _NOT_JSON if any(item is _NOT_JSON for item in pairs.values()) else pairs
    return _NOT_JSON


_NOT_JSON: Final = object()


def _first_error(schema: Any, instance: Any) -> str:
    validator = _validator(schema)
    try:
        error = best_match(validator.iter_errors(instance)) if validator is not None else None
    except Exception:  # a schema jsonschema cannot follow
        error = None
    if error is None:
        return "the arguments do not validate against the tool's parameters"
    where = "/".join(str(p) for p in error.path) or "(the arguments)"
    return f"{where}: {error.message}"[:300]


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


__all__ = ["Checked", "Repaired", "Unrepairable", "Valid", "check_call"]
