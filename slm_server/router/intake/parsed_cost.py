"""What a JSON body costs the router once it is parsed, bounded before it is parsed. Pure.

The budget for bodies in flight (``SLM_MAX_BODIES_IN_FLIGHT_MB``) counts bytes on the
wire, but what the router holds is the parsed form: Python objects of 24 to 240 bytes
for values written in two or three (``[1,2,3]``, ``[{},{}]``), the body decoded to text
(up to four bytes per character), and the copies the strict parser makes while it
checks. Measured on CPython 3.11 (``tracemalloc``, 8 MiB bodies), as held once parsed
and at the peak while parsing, in times the body's size: a long ASCII string 1 and 3;
an array of four-digit integers 7 and 9; of two-character strings 12 and 14; of
``{"a":1}`` 24 and 26; of empty objects 24 and 26 (78 before the strict parser's walk
kept one iterator per level instead of every sibling at once).

:func:`parsed_cost` is an upper bound of that peak, counted from the bytes alone (four
counts at memory speed): every opening brace, bracket, comma and colon at what the most
expensive value it can start costs, and each byte of the text at most four times (once
when the body is all ASCII). The body is charged this cost beside its own size before
it is parsed, for as long as its request runs, so the budget bounds what the router
really holds: at most one byte per byte charged.
"""

from __future__ import annotations

from typing import Final

# Upper bounds per structural byte, in bytes of parsed objects (measured maxima, with
# room): an object (its dict, a key's entry, the list slot it sits in), an array (its
# list, over-allocation, its slot), a value after a comma (an int, float or short
# string and its slot), a key and value after a colon (the entry in its dict).
PER_OBJECT: Final = 256
PER_ARRAY: Final = 96
PER_COMMA: Final = 72
PER_COLON: Final = 112
# The text the body is decoded to (one to four bytes per character: four when a string
# holds a character beyond U+FFFF, one when the body is ASCII), the strict parser's
# classified copy of the bytes, and the strings parsed from the text.
TEXT_COPIES_ASCII: Final = 3
TEXT_COPIES: Final = 9
# The parser's own fixed allocations, whatever the body.
FIXED: Final = 64 * 1024


def parsed_cost(raw: bytes) -> int:
    """Bytes the router may hold for ``raw`` parsed, beyond ``raw`` itself (an upper
    bound of :func:`~slm_server.router.intake.strict_json.loads`'s peak and of what the
    parsed value keeps)."""
    structure = (
        raw.count(b"{") * PER_OBJECT
        + raw.count(b"[") * PER_ARRAY
        + raw.count(b",") * PER_COMMA
        + raw.count(b":") * PER_COLON
    )
    copies = TEXT_COPIES_ASCII if raw.isascii() else TEXT_COPIES
    return FIXED + structure + copies * len(raw)


__all__ = ["parsed_cost"]
