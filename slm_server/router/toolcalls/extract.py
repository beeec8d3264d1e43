"""Calls a model wrote as text, read back out of it. Pure.

A model the router rendered tools for (:mod:`.render`) answers a call as text, and a
small model writes one as text even where its template took the tools. Read as calls:

* each ``<tool_call> ... </tool_call>`` (the close may be cut off at the end), holding
  a JSON object (or a list of them) with a ``name`` and ``arguments`` (or
  ``parameters``), however broken the JSON (:mod:`.repair` mends the arguments);
* a markdown code block of JSON (``json``, or no language), or the whole answer, that
  is such an object and names an offered tool (a block of code that shows a call, in
  Python or anything else, is an example: text).

What is not a call stays text. :func:`hold_from` tells a stream where text that may
be a call begins, so that what comes before it is sent at once.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Final

import json_repair

from slm_server.router.toolcalls.render import CLOSE, OPEN
from slm_server.router.toolcalls.repair import MAX_REPAIR_CHARS

_FENCE: Final = re.compile(r"```([a-zA-Z_]*)[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)
# Where a call may begin: the tag, or a code block (of JSON: these languages, or none).
_MARKERS: Final = (OPEN, "```")
CALL_LANGUAGES: Final = frozenset({"", "json", "tool_call", "tool_code"})


@dataclass(frozen=True, slots=True)
class TextCall:
    """A call read from text: its name and its arguments as written (a JSON string,
    possibly broken, or an object)."""

    name: str
    arguments: Any


def extract_calls(text: str, offered: Collection[str]) -> tuple[str, list[TextCall]]:
    """``text`` without the calls in it, and the calls (in order)."""
    if OPEN in text:
        return _tagged(text)
    calls: list[TextCall] = []
    kept = text
    for match in list(_FENCE.finditer(text)):
        if match.group(1).lower() not in CALL_LANGUAGES:
            continue  # a block of code: an example, not a call
        found = _calls_in(match.group(2), offered)
        if found:
            calls.extend(found)
            kept = kept.replace(match.group(0), "", 1)
    if calls:
        return kept.strip(), calls
    whole = _calls_in(text, offered) if text.lstrip().startswith(("{", "[")) else []
    if whole:
        return "", whole
    return text, []


def hold_from(text: str, at_start: bool) -> tuple[int, bool]:
    """Where in ``text`` a call may begin, and whether it surely does: at the tag; at a
    code block of JSON (a ``json`` block, or one without a language, whose first
    character is ``{`` or ``[``); where a marker's first characters end ``text``; and,
    ``at_start`` (nothing but blanks came before ``text``), at once when it begins as a
    JSON object or is blank so far. ``(len(text), False)`` when nowhere."""
    if at_start:
        head = text.lstrip()
        if not head:
            return 0, False
        if head[0] in "{[":
            return 0, True
    tag = text.find(OPEN)
    start = 0
    while True:
        fence = text.find("```", start)
        if fence < 0 or (0 <= tag < fence):
            break
        newline = text.find("\n", fence)
        if newline < 0:
            return fence, False  # its language not known yet
        after = text[newline + 1 :].lstrip()
        if not after:
            return fence, False
        language = text[fence + 3 : newline].strip().lower()
        if language in CALL_LANGUAGES and after[0] in "{[":
            return fence, True
        start = newline + 1  # a block of something else: text
    if tag >= 0:
        return tag, True
    for marker in _MARKERS:
        for size in range(min(len(marker) - 1, len(text)), 0, -1):
            if text.endswith(marker[:size]):
                return len(text) - size, False
    return len(text), False


def _tagged(text: str) -> tuple[str, list[TextCall]]:
    kept: list[str] = []
    calls: list[TextCall] = []
    rest = text
    while OPEN in rest:
        before, _, after = rest.partition(OPEN)
        kept.append(before)
        body, closed, rest = after.partition(CLOSE)
        if not closed:
            rest = ""
        calls.extend(_calls_in(body, None))
    kept.append(rest)
    return "".join(kept).strip(), calls


def _calls_in(body: str, offered: Collection[str] | None) -> list[TextCall]:
    """The calls in one block: an object or a list of objects with a ``name`` (offered,
    when ``offered`` is given)."""
    stripped = body.strip()
    fenced = _FENCE.search(stripped)
    if fenced is not None and offered is None:
        stripped = fenced.group(2).strip()
    if not stripped.startswith(("{", "[")):
        return []  # not JSON that json_repair could only make one of
    value = _loads(stripped)
    items = value if isinstance(value, list) else [value]
    calls: list[TextCall] = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            return []
        if offered is not None and item["name"] not in offered:
            return []
        arguments = item.get("arguments", item.get("parameters", {}))
        calls.append(TextCall(item["name"], arguments))
    return calls


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        pass
    if len(text) > MAX_REPAIR_CHARS:
        return None  # json_repair's time grows faster than the text: not on the loop
    try:
        return json_repair.repair_json(text, return_objects=True)
    except (ValueError, TypeError, RecursionError):
        return None


__all__ = ["CALL_LANGUAGES", "TextCall", "extract_calls", "hold_from"]
