"""Tiny GGUF files for the memory tests, written with the dev-only ``gguf`` package,
and hand-built hostile headers."""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np

MODELS = Path(__file__).resolve().parents[3] / "models"
SMOLLM2 = MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3 = MODELS / "gemma-3-270m-q4_k_m.gguf"


def write_gguf(
    path: Path,
    arch: str,
    fill: Callable[[gguf.GGUFWriter], None],
    *,
    tensor_bytes: int = 64,
) -> Path:
    """A GGUF file of ``arch`` with the metadata ``fill`` adds and one f32 tensor."""
    writer = gguf.GGUFWriter(path, arch)
    fill(writer)
    writer.add_tensor("token_embd.weight", np.zeros(tensor_bytes // 4, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def llama_like(
    *,
    layers: int = 4,
    context: int = 2048,
    heads: int = 8,
    kv_heads: int | list[int] | None = 2,
    embd: int = 256,
    ff: int = 512,
    vocab: int = 1000,
    key_length: int | None = None,
    value_length: int | None = None,
) -> Callable[[gguf.GGUFWriter], None]:
    def fill(writer: gguf.GGUFWriter) -> None:
        writer.add_block_count(layers)
        writer.add_context_length(context)
        writer.add_embedding_length(embd)
        writer.add_feed_forward_length(ff)
        writer.add_head_count(heads)
        if kv_heads is not None:
            writer.add_head_count_kv(kv_heads)
        if key_length is not None:
            writer.add_key_length(key_length)
        if value_length is not None:
            writer.add_value_length(value_length)
        writer.add_vocab_size(vocab)

    return fill


def raw_header(
    *,
    magic: bytes = b"GGUF",
    version: int = 3,
    tensors: int = 0,
    kvs: int = 0,
    body: bytes = b"",
) -> bytes:
    return magic + struct.pack("<IQQ", version, tensors, kvs) + body


def raw_string(text: bytes, length: int | None = None) -> bytes:
    return struct.pack("<Q", len(text) if length is None else length) + text


def raw_kv(key: bytes, value_type: int, payload: bytes) -> bytes:
    return raw_string(key) + struct.pack("<I", value_type) + payload
