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

import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import json_repair
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, best_match

# How alike a misspelled name must be to an offered one (difflib's ratio), and by how
# much the closest must beat the next for the choice to be unambiguous.
NAME_CUTOFF: Final = 0.8
NAME_MARGIN: Final = 0.1


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
    ``{}`` for a tool without parameters)."""
    repairs: list[str] = []
    offered = _offered_name(name, tools)
    if offered is None:
        return Unrepairable(name, f"no offered tool is named {name[:64]!r}")
    if offered != name:
        repairs.append("name")
    schema = tools[offered] or {}
    validator = _validator(schema)
    if validator is None:
        return Unrepairable(offered, "the tool's parameters are not a usable JSON Schema")
    parsed = _parsed(arguments)
    if isinstance(parsed, dict) and validator.is_valid(parsed):
        if not repairs and isinstance(arguments, str):
            return Valid(offered, arguments)
        return Repaired(offered, _dumps(parsed), tuple(repairs))
    text = arguments if isinstance(arguments, str) else _dumps(arguments)
    if not isinstance(parsed, dict):
        mended = _mend(text, None)
        if not isinstance(mended, dict):
            return Unrepairable(offered, "the arguments are not a JSON object")
        repairs.append("arguments_json")
        parsed = mended
        if validator.is_valid(parsed):
            return Repaired(offered, _dumps(parsed), tuple(repairs))
    coerced = _mend(_dumps(parsed), schema) if schema else None
    if isinstance(coerced, dict) and validator.is_valid(coerced):
        return Repaired(offered, _dumps(coerced), (*repairs, "arguments_schema"))
    return Unrepairable(offered, _first_error(validator, parsed))


def _offered_name(name: str, tools: Mapping[str, Any]) -> str | None:
    """``name`` when offered; else the one offered name that is the same but for case,
    or clearly the closest; None when there is none, or no clear one."""
    if name in tools:
        return name
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


def _validator(schema: Any) -> Draft202012Validator | None:
    if not isinstance(schema, dict):
        return None
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError:
        return None
    return Draft202012Validator(schema)


def _parsed(arguments: Any) -> Any:
    """The arguments as JSON, strictly; None when they are not."""
    if not isinstance(arguments, str):
        return arguments
    try:
        return json.loads(arguments)
    except (ValueError, RecursionError):
        return None


def _mend(text: str, schema: Any) -> Any:
    """``text`` repaired by ``json_repair`` (against ``schema`` when given: its lossless
    coercions); None when it cannot be."""
    try:
        if schema:
            return json_repair.repair_json(text, return_objects=True, schema=schema)
        return json_repair.repair_json(text, return_objects=True)
    except (ValueError, TypeError, RecursionError):
        return None


def _first_error(validator: Draft202012Validator, instance: Any) -> str:
    error = best_match(validator.iter_errors(instance))
    if error is None:
        return "the arguments do not validate against the tool's parameters"
    where = "/".join(str(p) for p in error.path) or "(the arguments)"
    return f"{where}: {error.message}"[:300]


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


__all__ = ["Checked", "Repaired", "Unrepairable", "Valid", "check_call"]
