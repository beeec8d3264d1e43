"""Approximate prefix matching for routing: which replica has most likely kept the
leading part of a request in its prompt cache. Pure, no tokenizer.

A request's leading content (the Responses API's ``instructions``, then its messages in
order, role and text; or its ``prompt``; or its ``input``) is cut into blocks of
``BLOCK_CHARS`` characters, and each whole block gets a chained hash: the hash of
block *i* covers block *i-1*'s hash, so two requests whose block *i* hashes alike share
(short of a hash collision) their whole first *i + 1* blocks. A partial last block is
not hashed: a prompt shorter than one block matches nothing. At most ``MAX_BLOCKS``
blocks are hashed, so a request costs at most that many hashes however long it is.

A request that names its cache (``prompt_cache_key``, as OpenAI's APIs take it) has the
key's hash as its first block, and its blocks chained from it
(:func:`request_hashes`): requests with the same key go where the key went, and the
same prefix under another key is another prefix, as OpenAI combines the two.

Each replica has a :class:`PrefixIndex`, a bounded (approximately LRU) set of the
block hashes it was sent recently. A request's blocks are recorded last block first, so
a block is never older in the index than a later block of the same prefix: the blocks
of a prefix that are present are always its first ones, and the longest match is found
by bisection.

Python's ``hash`` of a string is salted per process, which suits an index that lives
and dies with the router.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

BLOCK_CHARS: Final = 64
MAX_BLOCKS: Final = 256  # 16 KiB of leading characters
INDEX_BLOCKS: Final = 4096  # per replica: 256 KiB of prefixes, about 64k tokens
_LIMIT: Final = BLOCK_CHARS * MAX_BLOCKS
# Between the parts of the leading text: no text part can forge a role boundary.
_PART: Final = "\x1e"
_ROLE: Final = "\x1f"
_KEY: Final = "prompt_cache_key"
_hash = hash  # one dictionary lookup fewer per block


def _text_of(content: Any, parts: list[str]) -> int:
    """Append the text of a message's ``content`` (a string, or a list of parts with
    ``text``); returns the characters added. Images and audio add nothing."""
    if isinstance(content, str):
        parts.append(content)
        return len(content)
    added = 0
    if isinstance(content, list):
        for part in content:
            text = part.get("text") if isinstance(part, dict) else part
            if isinstance(text, str):
                parts.append(text)
                added += len(text)
    return added


def leading_text(payload: dict[str, Any]) -> str:
    """The request's leading content as one string, cut at ``MAX_BLOCKS`` blocks."""
    parts: list[str] = []
    size = 0
    instructions = payload.get("instructions")
    if isinstance(instructions, str):
        parts.append(instructions)
        size += len(instructions)
    items = payload.get("messages")
    if not isinstance(items, list):
        items = payload.get("input", payload.get("prompt"))
    if isinstance(items, str):
        parts.append(items)
        return "".join(parts)[:_LIMIT]
    if not isinstance(items, list):
        return "".join(parts)[:_LIMIT]
    for item in items:
        if size >= _LIMIT:
            break
        if isinstance(item, dict):
            role = item.get("role")
            parts.append(f"{_PART}{role if isinstance(role, str) else ''}{_ROLE}")
            size += 3 + _text_of(item.get("content"), parts)
        else:
            parts.append(_PART)
            size += 1 + _text_of(item, parts)
    return "".join(parts)[:_LIMIT]


def block_hashes(text: str, seed: int = 0) -> list[int]:
    """The chained hash of every whole block of ``text``, first block first, the
    first one chained from ``seed``."""
    hashes: list[int] = []
    append = hashes.append
    chained = seed
    step = BLOCK_CHARS
    for start in range(0, len(text) - step + 1, step):
        chained = _hash((chained, text[start : start + step]))
        append(chained)
    return hashes


def request_hashes(payload: dict[str, Any]) -> list[int]:
    """The blocks a request is matched and recorded by: its leading text's, after the
    hash of its ``prompt_cache_key`` when it has one (a non-empty string)."""
    text = leading_text(payload)
    key = payload.get(_KEY)
    if not isinstance(key, str) or not key:
        return block_hashes(text)
    seed = _hash((_KEY, key))
    return [seed, *block_hashes(text, seed)]


class PrefixIndex:
    """The block hashes one replica was sent recently, at most ``capacity`` of them.

    An approximate LRU in two generations: blocks are added to the current one, which,
    once it holds half the capacity, becomes the previous one, and the previous one
    is dropped whole. A block is found in either, and sending it again moves it to
    the current one. Every step is a plain dictionary operation: no per-block
    bookkeeping of recency, and at most ``capacity`` blocks are kept.
    """

    __slots__ = ("_current", "_half", "_previous", "capacity")

    def __init__(self, capacity: int = INDEX_BLOCKS) -> None:
        self.capacity = capacity
        self._half = max(1, capacity // 2)
        self._current: dict[int, None] = {}
        self._previous: dict[int, None] = {}

    def __len__(self) -> int:
        return len(self._current) + sum(1 for b in self._previous if b not in self._current)

    def __contains__(self, block: int) -> bool:
        return block in self._current or block in self._previous

    def match(self, hashes: Sequence[int]) -> int:
        """How many leading blocks of ``hashes`` this replica was sent. The present
        blocks of a prefix are always its first ones, so the first and the last are
        looked at (the common answers: none, all), then the rest by bisection."""
        current, previous = self._current, self._previous
        count = len(hashes)
        if not count:
            return 0
        first, last = hashes[0], hashes[-1]
        if first not in current and first not in previous:
            return 0
        if last in current or last in previous:
            return count
        low, high = 1, count - 1
        while low < high:
            middle = (low + high + 1) // 2
            block = hashes[middle - 1]
            if block in current or block in previous:
                low = middle
            else:
                high = middle - 1
        return low

    def record(self, hashes: Sequence[int]) -> None:
        """Note that the replica was sent these blocks: last first, so that a prefix's
        first blocks are never older than its later ones (the previous generation is
        only ever dropped whole). A block found in the current generation ends the
        walk: the blocks before it were recorded after it, into the same generation
        (there is none newer)."""
        current = self._current
        half = self._half
        for block in reversed(hashes):
            if block in current:
                return
            if len(current) >= half:
                self._previous = current
                current = self._current = {}
            current[block] = None

    def clear(self) -> None:
        """Forget everything: the replica's cache is gone (it restarted)."""
        self._current = {}
        self._previous = {}


__all__ = [
    "BLOCK_CHARS",
    "INDEX_BLOCKS",
    "MAX_BLOCKS",
    "PrefixIndex",
    "block_hashes",
    "leading_text",
    "request_hashes",
]
