"""A custom (freeform) tool's input, read from the arguments of the chat function call
that stands for it (``{"input": "..."}``, see :mod:`.tools`): whole with
:func:`custom_input`, and as the arguments stream with :class:`InputReader`.

Small models do not always keep to the shape: arguments that are not a JSON object
with a string ``input`` give the object's one string value, else the arguments' own
text. Pure: no I/O.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

from slm_server.router.apis.responses.tools import CUSTOM_INPUT

# What streamed arguments start with before the input's first character.
_HEAD: Final = re.compile(r'\s*\{\s*"' + CUSTOM_INPUT + r'"\s*:\s*"')
_HEAD_TEXT: Final = '{"' + CUSTOM_INPUT + '":"'
_ESCAPES: Final = {
    '"': '"',
    "\\": "\\",
    "/": "/",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
}


def custom_arguments(text: str) -> str:
    """The chat function arguments that carry a custom tool's input ``text``."""
    return json.dumps({CUSTOM_INPUT: text}, ensure_ascii=False)


def custom_input(arguments: str) -> str:
    """The input a custom tool call's chat ``arguments`` carry (the arguments' own
    text when what they decode to is no text: a lone surrogate escaped in them)."""
    text = _decoded(arguments)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return arguments
    return text


def _decoded(arguments: str) -> str:
    try:
        value: Any = json.loads(arguments)
    except (ValueError, RecursionError):
        return arguments
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        if isinstance(value.get(CUSTOM_INPUT), str):
            return str(value[CUSTOM_INPUT])
        strings = [v for v in value.values() if isinstance(v, str)]
        if len(value) == 1 and strings:
            return strings[0]
    return arguments


class InputReader:
    """Decodes the input out of arguments arriving piece by piece.

    :meth:`feed` takes the next piece and returns the input's characters it completes
    (nothing while the arguments do not start like ``{"input": "``, or once they
    turn out not to); :meth:`finish` returns what is left of the whole input, given
    that :meth:`feed` handed out a prefix of it, and the whole input.
    """

    def __init__(self) -> None:
        self.arguments = ""
        self.sent = ""
        self._at = -1  # where the next undecoded character of the string is; -1: the head
        self._off = False  # the arguments are not the usual shape, or the string ended

    def feed(self, piece: str) -> str:
        self.arguments += piece
        if self._off:
            return ""
        if self._at < 0:
            head = _HEAD.match(self.arguments)
            if head is None:
                compact = re.sub(r"\s+", "", self.arguments)
                self._off = not _HEAD_TEXT.startswith(compact)
                return ""
            self._at = head.end()
        text = self._decode()
        self.sent += text
        return text

    def finish(self) -> tuple[str, str]:
        """The rest of the input still to send, and the whole input."""
        whole = custom_input(self.arguments)
        rest = whole[len(self.sent) :] if whole.startswith(self.sent) else ""
        self.sent += rest
        return rest, whole

    def _decode(self) -> str:
        """The string's characters from ``_at`` that are complete, escapes decoded."""
        source, at, out = self.arguments, self._at, []
        end = len(source)
        while at < end:
            char = source[at]
            if char == '"':
                self._off = True
                break
            if char != "\\":
                out.append(char)
                at += 1
                continue
            if at + 1 >= end:
                break
            code = source[at + 1]
            if code in _ESCAPES:
                out.append(_ESCAPES[code])
                at += 2
                continue
            if code != "u":
                self._off = True  # not JSON: the whole arguments decide at the end
                break
            unit = _hex(source, at + 2)
            if unit is None:
                break
            if 0xD800 <= unit < 0xDC00:  # a high surrogate: its low one must follow
                if at + 12 > end:
                    break
                low = _hex(source, at + 8) if source[at + 6 : at + 8] == "\\u" else None
                if low is not None and 0xDC00 <= low < 0xE000:
                    out.append(chr(0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00)))
                    at += 12
                    continue
                self._off = True
                break
            if 0xDC00 <= unit < 0xE000:  # a low surrogate alone: no character
                self._off = True
                break
            out.append(chr(unit))
            at += 6
        self._at = at
        return "".join(out)


def _hex(source: str, at: int) -> int | None:
    digits = source[at : at + 4]
    if len(digits) < 4:
        return None
    try:
        return int(digits, 16)
    except ValueError:
        return None


__all__ = ["InputReader", "custom_arguments", "custom_input"]
