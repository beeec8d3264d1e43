"""Strict JSON for request bodies: what RFC 8259 allows and every backend can parse. Pure.

    loads(raw)          the JSON value of ``raw``, or InvalidRequest (400 ``invalid_json``)
    dumps_body(payload) a parsed payload as UTF-8 JSON bytes, never with NaN or Infinity

A body the router forwards must be one the backend parses: llama-server answers 500 to
JSON its parser (nlohmann::json) refuses, and the watchdog counts a 5xx against the
backend, so a client could restart a healthy backend at will. Python's ``json.loads``
accepts more than RFC 8259 and than nlohmann::json; ``loads`` refuses all of that:

- bytes that are not UTF-8 (Python would guess UTF-16 or UTF-32 from the first bytes,
  and pass UTF-8-encoded surrogates); a leading UTF-8 byte order mark is ignored, as
  RFC 8259 permits and as nlohmann::json does (``lexer::skip_bom``), so the raw body
  may still be forwarded with it;
- ``NaN``, ``Infinity`` and ``-Infinity``;
- a number whose value as a double is not finite (``1e999``, an integer beyond about
  1.8e308): nlohmann::json reports "number overflow" where Python gives ``inf``, which
  ``json.dumps`` would write back as ``Infinity``;
- a ``\\u`` escape of a lone UTF-16 surrogate, in a string or a key (a pair, as in
  ``"\\ud83d\\ude00"``, is one character and fine);
- arrays and objects nested more than :data:`MAX_DEPTH` deep, however deep (100,000
  ``[`` is the same 400, never a ``RecursionError``);
- everything ``json.loads(strict=True)`` already refuses (control characters in
  strings, single quotes, trailing commas or data, ...).

Duplicate keys are allowed, the last one winning, as in both parsers. The checks that
need more than ``json.loads`` run only when the bytes could need them (a run of 309
digits, a ``\\ud8``-``\\udf`` escape, more than :data:`MAX_DEPTH` brackets), so an
ordinary body costs one decode, one parse and a few passes at memory speed.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Iterator
from typing import Any, Final, NoReturn

from slm_server.errors import InvalidRequest

# Deeper than any real request (tool schemas included) and far below the C stack
# depth at which Python's parser would give up.
MAX_DEPTH: Final = 128
_PREFIX: Final = "The request body is not valid JSON: "
_BOM: Final = "\ufeff"
_UTF16_BOMS: Final = (b"\xff\xfe", b"\xfe\xff")
# The digits of the largest finite double: an integer with more cannot be one.
_MAX_INT_DIGITS: Final = len(str(int(sys.float_info.max)))


def _class_table() -> bytes:
    """For ``bytes.translate``: the body's bytes reduced to what the cheap checks look
    for (digits become "0", brackets and braces "["), everything else a space.
    Translating and searching bytes run at memory speed, where a regular expression
    over the whole body would not."""
    table = bytearray(b" " * 256)
    for byte in b"0123456789":
        table[byte] = ord("0")
    for byte in b"[{":
        table[byte] = ord("[")
    return bytes(table)


_CLASSES: Final = _class_table()
_LONG_INT: Final = b"0" * _MAX_INT_DIGITS
# An escape of U+D800 to U+DFFF (a literal prefix makes this search fast).
_SURROGATE_ESCAPE: Final = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE: Final = re.compile("[\ud800-\udfff]")
_IDENTIFIER: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SHOWN: Final = 40  # characters of a refused number or a key quoted in a message
_LONE: Final = "holds a lone UTF-16 surrogate (a \\ud800-\\udfff escape without its pair)"


def _refuse(reason: str) -> NoReturn:
    raise InvalidRequest(_PREFIX + reason, code="invalid_json")


def _refuse_constant(name: str) -> NoReturn:
    _refuse(f"{name} is not a JSON number (RFC 8259 has no NaN or Infinity)")


def _refuse_number(literal: str) -> NoReturn:
    shown = (
        literal if len(literal) <= _SHOWN else f"{literal[:_SHOWN]}... ({len(literal)} characters)"
    )
    _refuse(f"the number {shown} is too large for a double")


def _finite_float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        _refuse_number(literal)
    return value


def _finite_int(literal: str) -> int:
    digits = len(literal) - literal.startswith("-")
    if digits > _MAX_INT_DIGITS:  # also spares int() its 4,300-digit ValueError
        _refuse_number(literal)
    value = int(literal)
    if digits == _MAX_INT_DIGITS:
        try:
            float(value)
        except OverflowError:
            _refuse_number(literal)
    return value


# Every float literal goes through the check (there are few in a request); integers
# only when the body holds a run of digits long enough to overflow (token ids are many).
_FLOATS_CHECKED: Final = json.JSONDecoder(
    parse_constant=_refuse_constant, parse_float=_finite_float
)
_ALL_CHECKED: Final = json.JSONDecoder(
    parse_constant=_refuse_constant, parse_float=_finite_float, parse_int=_finite_int
)


def _text_of(raw: bytes) -> str:
    if raw.startswith(_UTF16_BOMS) or raw.find(b"\x00", 0, 4) >= 0:
        # A JSON text starts with an ASCII character, so a NUL among the first bytes
        # means UTF-16 or UTF-32.
        _refuse("it is UTF-16 or UTF-32; send UTF-8")
    try:
        text = raw.decode("utf-8")  # strict: no surrogates, no overlong forms
    except UnicodeDecodeError as exc:
        _refuse(f"it is not UTF-8 ({exc.reason} at byte {exc.start})")
    return text[1:] if text.startswith(_BOM) else text


def _where(link: tuple[Any, ...] | None) -> str:
    """``messages[0].content`` from a chain of ``(parent, key)`` links."""
    keys: list[str | int] = []
    while link is not None:
        link, key = link
        keys.append(key)
    shown = ""
    for key in reversed(keys):
        if isinstance(key, int):
            shown += f"[{key}]"
        elif _IDENTIFIER.fullmatch(key) and len(key) <= _SHOWN:
            shown += f".{key}" if shown else key
        else:
            shown += f"[{json.dumps(key[:_SHOWN])}]"  # ASCII-escaped: safe to echo
    return shown or "the top level"


def _walk(value: Any, depth_limit: bool, surrogates: bool) -> None:
    """Refuse nesting past :data:`MAX_DEPTH` and lone surrogates, without recursion and
    holding one iterator per level (a million sibling objects are walked one at a
    time, never stacked at once)."""
    root = value.items() if type(value) is dict else enumerate(value)
    stack: list[tuple[Iterator[tuple[Any, Any]], tuple[Any, ...] | None]] = [(iter(root), None)]
    while stack:
        items, where = stack[-1]
        for key, item in items:
            if surrogates and type(key) is str and not key.isascii() and _SURROGATE.search(key):
                _refuse(f"a key of the object at {_where(where)} {_LONE}")
            kind = type(item)
            if kind is dict or kind is list:
                if depth_limit and len(stack) + 1 > MAX_DEPTH:
                    _refuse(f"arrays and objects are nested more than {MAX_DEPTH} deep")
                inner = item.items() if kind is dict else enumerate(item)
                stack.append((iter(inner), (where, key)))
                break
            if surrogates and kind is str and not item.isascii() and _SURROGATE.search(item):
                _refuse(f"the string at {_where((where, key))} {_LONE}")
        else:
            stack.pop()


def _more_than(classes: bytes, limit: int) -> bool:
    """Whether ``classes`` (see :data:`_CLASSES`) holds more than ``limit`` brackets."""
    at = -1
    for _ in range(limit + 1):
        at = classes.find(b"[", at + 1)
        if at < 0:
            return False
    return True


def loads(raw: bytes) -> Any:
    """The JSON value of ``raw`` under the rules above; InvalidRequest otherwise."""
    text = _text_of(raw)
    classes = raw.translate(_CLASSES)
    decoder = _ALL_CHECKED if _LONG_INT in classes else _FLOATS_CHECKED
    try:
        value = decoder.decode(text)
    except json.JSONDecodeError as exc:
        _refuse(str(exc))
    except RecursionError:
        _refuse(f"arrays and objects are nested more than {MAX_DEPTH} deep")
    deep = _more_than(classes, MAX_DEPTH)
    surrogates = _SURROGATE_ESCAPE.search(raw) is not None
    if (deep or surrogates) and type(value) in (dict, list):
        _walk(value, deep, surrogates)
    elif surrogates and type(value) is str and _SURROGATE.search(value):
        _refuse(f"the string {_LONE}")
    return value


def dumps_body(payload: Any) -> bytes:
    """``payload`` as compact UTF-8 JSON for a backend. Raises ValueError (a router bug,
    never a client's) rather than write NaN, Infinity or a lone surrogate."""
    return json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode(
        "utf-8"
    )
