"""Whether a model can fill in the middle (llama-server's ``/infill``; OpenAI's ``suffix``).

llama-server answers ``/infill`` only for a model whose vocabulary has the three
fill-in-the-middle tokens (prefix, suffix, middle); without them it answers 501. It
finds each token as llama.cpp's vocabulary loader does (``src/llama-vocab.cpp`` at the
pinned commit): by its id under a GGUF key (``tokenizer.ggml.fim_pre_token_id`` and its
two siblings, or the older ``prefix_token_id``, ``suffix_token_id``,
``middle_token_id``), an id past the vocabulary being ignored; else by its text among
the vocabulary's tokens (``<|fim_prefix|>``, ``<fim_prefix>``, ``<PRE>``...). The
header is read with :func:`~slm_server.memory.gguf_header.read_header`, the vocabulary
streamed past these texts and never kept.

What a registry entry's model says (its ``infill`` field, else its file) is
:mod:`slm_server.registry.infill`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from slm_server.memory.gguf_header import (
    VOCABULARY_KEY,
    GgufArray,
    GgufError,
    GgufValue,
    read_header,
)

# Each token's GGUF keys, in llama.cpp's order (a later one found wins), and the texts
# its loader looks for when none gave a usable id.
ROLES: Final = ("prefix", "suffix", "middle")
ID_KEYS: Final[Mapping[str, tuple[str, ...]]] = {
    "prefix": ("tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id"),
    "suffix": ("tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id"),
    "middle": ("tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id"),
}
TEXTS: Final[Mapping[str, tuple[str, ...]]] = {
    "prefix": (
        "<|fim_prefix|>",
        "<fim-prefix>",
        "<fim_prefix>",
        "<\uff5cfim\u2581begin\uff5c>",
        "<PRE>",
        "\u2581<PRE>",
        "<|code_prefix|>",
        "<|prefix|>",
    ),
    "suffix": (
        "<|fim_suffix|>",
        "<fim-suffix>",
        "<fim_suffix>",
        "<\uff5cfim\u2581hole\uff5c>",
        "<SUF>",
        "\u2581<SUF>",
        "<|code_suffix|>",
        "<|suffix|>",
    ),
    "middle": (
        "<|fim_middle|>",
        "<fim-middle>",
        "<fim_middle>",
        "<\uff5cfim\u2581end\uff5c>",
        "<MID>",
        "\u2581<MID>",
        "<|code_middle|>",
        "<|middle|>",
    ),
}
ALL_TEXTS: Final = frozenset(text for texts in TEXTS.values() for text in texts)


@dataclass(frozen=True)
class Infill:
    """Whether a model takes infill requests (None: the gateway cannot tell), and why,
    in words an error or ``check`` can show."""

    takes: bool | None
    why: str


def tokens_found(metadata: Mapping[str, GgufValue], texts: frozenset[str]) -> tuple[str, ...]:
    """The roles (of :data:`ROLES`) whose token the vocabulary has, by a usable id
    under its keys or by one of its texts among ``texts`` (the vocabulary's)."""
    vocabulary = metadata.get(VOCABULARY_KEY)
    size = (
        vocabulary.length
        if isinstance(vocabulary, GgufArray)
        else len(vocabulary)
        if isinstance(vocabulary, tuple)
        else 0
    )
    found = []
    for role in ROLES:
        ids = [metadata.get(key) for key in ID_KEYS[role]]
        by_id = any(
            isinstance(value, int) and not isinstance(value, bool) and 0 <= value < size
            for value in ids
        )
        if by_id or any(text in texts for text in TEXTS[role]):
            found.append(role)
    return tuple(found)


def gguf_infill(path: Path) -> Infill:
    """Whether the GGUF model at ``path`` has the three fill-in-the-middle tokens."""
    try:
        header = read_header(path, ALL_TEXTS)
    except GgufError as exc:
        return Infill(None, f"its GGUF header cannot be read ({exc})")
    found = tokens_found(header.metadata, header.found_tokens)
    missing = [role for role in ROLES if role not in found]
    if not missing:
        return Infill(True, "its GGUF vocabulary has the fill-in-the-middle tokens")
    return Infill(
        False,
        "its GGUF vocabulary has no fill-in-the-middle "
        + " or ".join(missing)
        + " token (llama-server answers /infill with 501 for it)",
    )


__all__ = ["ALL_TEXTS", "ID_KEYS", "ROLES", "TEXTS", "Infill", "gguf_infill", "tokens_found"]
