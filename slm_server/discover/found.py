"""One found model and its facts, read from its GGUF header.

The architecture and context length are the header's (``general.architecture``,
``{arch}.context_length``); the quantization is ``general.file_type`` named as
llama.cpp names it (``llama_ftype``), else read from the file name (``Q4_K_M``); the
type is ``embeddings`` when the header sets a pooling type or the architecture is an
encoder, ``rerank`` when the pooling is rank or the name says rerank, else ``chat``.
A file whose header cannot be read keeps its size and unknown (None) facts.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from slm_server.discover.places import Candidate
from slm_server.memory.gguf_header import GgufError, GgufValue, read_header

# llama.cpp's llama_ftype (include/llama.h), the value of ``general.file_type``.
FILE_TYPES: Final[Mapping[int, str]] = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    7: "Q8_0",
    8: "Q5_0",
    9: "Q5_1",
    10: "Q2_K",
    11: "Q3_K_S",
    12: "Q3_K_M",
    13: "Q3_K_L",
    14: "Q4_K_S",
    15: "Q4_K_M",
    16: "Q5_K_S",
    17: "Q5_K_M",
    18: "Q6_K",
    19: "IQ2_XXS",
    20: "IQ2_XS",
    21: "Q2_K_S",
    22: "IQ3_XS",
    23: "IQ3_XXS",
    24: "IQ1_S",
    25: "IQ4_NL",
    26: "IQ3_S",
    27: "IQ3_M",
    28: "IQ2_S",
    29: "IQ2_M",
    30: "IQ4_XS",
    31: "IQ1_M",
    32: "BF16",
    36: "TQ1_0",
    37: "TQ2_0",
    38: "MXFP4_MOE",
}
# Architectures llama.cpp runs as encoders only: they embed, never chat.
EMBEDDING_ARCHITECTURES: Final = frozenset(
    {"bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "modern-bert", "neo-bert", "t5encoder"}
)
POOLING_RANK: Final = 4  # llama_pooling_type LLAMA_POOLING_TYPE_RANK
_NAMED_QUANT: Final = re.compile(
    r"(?<![A-Za-z0-9])(I?Q\d_[A-Z0-9_]*[A-Z0-9]|MXFP4(?:_MOE)?|BF16|F16|F32)"
    r"(?![A-Za-z0-9])",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Found:
    """One model found on this machine (None where its header does not say)."""

    name: str
    store: str
    path: str
    size: int  # bytes, every part of a split model
    architecture: str | None
    context_length: int | None
    quantization: str | None
    type: str | None  # "chat", "embeddings", "rerank"; None when the header is unread


def quantization_from_name(name: str) -> str | None:
    """The quantization a file name states (``model-Q4_K_M.gguf`` -> ``Q4_K_M``)."""
    stem = name.rsplit("/", 1)[-1]
    found = _NAMED_QUANT.findall(stem.removesuffix(".gguf"))
    return found[-1].upper() if found else None


def model_type(name: str, metadata: Mapping[str, GgufValue], arch: str | None) -> str:
    """``rerank``, ``embeddings`` or ``chat``, from the header and the name."""
    pooling = metadata.get(f"{arch}.pooling_type") if arch else None
    if pooling == POOLING_RANK or "rerank" in name.lower():
        return "rerank"
    if isinstance(pooling, int) and not isinstance(pooling, bool) and pooling > 0:
        return "embeddings"
    if arch in EMBEDDING_ARCHITECTURES:
        return "embeddings"
    return "chat"


def _size(candidate: Candidate) -> int:
    total = 0
    for part in candidate.parts:
        with contextlib.suppress(OSError):  # a part gone since the walk counts nothing
            total += part.stat().st_size
    return total


def read_found(candidate: Candidate) -> Found:
    """The facts of ``candidate``, its header read (never raising for a bad file)."""
    size = _size(candidate)
    by_name = quantization_from_name(candidate.name)
    try:
        metadata = read_header(candidate.path).metadata
    except GgufError:
        return Found(
            candidate.name, candidate.store, str(candidate.path), size, None, None, by_name, None
        )
    found = metadata.get("general.architecture")
    arch = found if isinstance(found, str) else None
    context = metadata.get(f"{arch}.context_length") if arch else None
    file_type = metadata.get("general.file_type")
    quant = FILE_TYPES.get(file_type) if isinstance(file_type, int) else None
    return Found(
        candidate.name,
        candidate.store,
        str(candidate.path),
        size,
        arch,
        context if isinstance(context, int) and not isinstance(context, bool) else None,
        quant or by_name,
        model_type(candidate.name, metadata, arch),
    )


__all__ = ["FILE_TYPES", "Found", "model_type", "quantization_from_name", "read_found"]
