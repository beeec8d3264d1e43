"""Each store's real layout built under a temporary home, with tiny GGUF files."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import gguf

from tests.unit.memory.gguf_files import llama_like, write_gguf

Fill = Callable[[gguf.GGUFWriter], None]


def tiny_gguf(
    path: Path,
    arch: str = "llama",
    *,
    context: int = 2048,
    file_type: int | None = None,
    pooling: int | None = None,
) -> Path:
    """A small valid GGUF file: ``arch``, its context length, and optionally
    ``general.file_type`` and ``{arch}.pooling_type``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    base = llama_like(context=context)

    def fill(writer: gguf.GGUFWriter) -> None:
        base(writer)
        if file_type is not None:
            writer.add_file_type(file_type)
        if pooling is not None:
            writer.add_pooling_type(gguf.PoolingType(pooling))

    return write_gguf(path, arch, fill)


def hf_file(hub: Path, repo_id: str, name: str, revision: str = "abc123def456") -> Path:
    """``models--owner--repo/snapshots/{revision}/{name}``: a symlink into ``blobs/``,
    as huggingface_hub lays it out; returns the snapshot's link."""
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    blob = repo / "blobs" / f"blob-{name.replace('/', '_')}"
    tiny_gguf(blob, file_type=15)
    link = repo / "snapshots" / revision / name
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(blob, link.parent))  # ../../blobs/… from a top file
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    return link


def ollama_model(root: Path, model: str, tag: str, namespace: str = "library") -> Path:
    """A manifest under ``manifests/registry.ollama.ai`` whose model layer names a blob
    holding a GGUF file (a projector layer beside it); returns the blob."""
    hexes = {k: hashlib.sha256(f"{model}:{tag}:{k}".encode()).hexdigest() for k in "mp"}
    blob = root / "blobs" / f"sha256-{hexes['m']}"
    tiny_gguf(blob, file_type=15, context=4096)
    manifest = root / "manifests" / "registry.ollama.ai" / namespace / model / tag
    manifest.parent.mkdir(parents=True, exist_ok=True)
    layers = [
        {"mediaType": "application/vnd.ollama.image.projector", "digest": f"sha256:{hexes['p']}"},
        {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{hexes['m']}"},
    ]
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": layers}))
    return blob
