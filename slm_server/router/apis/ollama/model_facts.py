"""What Ollama's clients are told of a model beyond its registry entry, read from its
GGUF file's header (once per file version: its path, size and time): the family,
the size label, the trained context, the chat template and the header's other scalar
metadata; and what the template shows it can do (tools, thinking).

A model without a local GGUF file (MLX, a remote engine, a file that cannot be read)
has the registry's word alone."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from slm_server.memory.gguf_header import GgufArray, GgufError, read_header
from slm_server.registry.model_path import (
    ModelPathError,
    resolve_file_field,
    resolve_model_path,
)
from slm_server.registry.schema import ModelEntry

log = logging.getLogger("slm_server.router")

# What in a chat template shows that it renders the model's reasoning (Qwen's and
# DeepSeek's ``enable_thinking`` switch and ``<think>`` blocks, the templates that
# write back an assistant's ``reasoning_content``).
THINKING_MARKS: Final = ("enable_thinking", "reasoning_content", "<think>")
MAX_MODEL_INFO: Final = 256  # metadata keys shown by /api/show at most
MAX_TEMPLATE_BYTES: Final = 1 << 20
_KEPT: Final = 64  # file versions remembered


@dataclass(frozen=True)
class Facts:
    """One model's file facts (None or empty where unknown)."""

    format: str  # "gguf", "mlx", "remote"
    size: int = 0
    modified_at: str = ""
    digest: str = ""
    family: str | None = None
    parameter_size: str | None = None
    trained_context: int | None = None
    template: str = ""
    metadata: Mapping[str, Any] = field(default_factory=dict)

    @property
    def thinking(self) -> bool:
        """Whether the template renders reasoning."""
        return any(mark in self.template for mark in THINKING_MARKS)

    @property
    def template_tools(self) -> bool:
        """Whether the template mentions tools at all (a template that takes none
        cannot render them)."""
        return "tools" in self.template


def _stamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


def _digest(*parts: object) -> str:
    return hashlib.sha256(":".join(str(p) for p in parts).encode()).hexdigest()


class ModelFacts:
    """Reads and remembers each model file's facts."""

    def __init__(self) -> None:
        self._known: dict[tuple[str, int, int, str | None], Facts] = {}

    async def read(self, entry: ModelEntry) -> Facts:
        """:meth:`of`, with a file not read yet read off the event loop (a vocabulary of
        a few hundred thousand tokens is skipped through in a tenth of a second)."""
        return await asyncio.to_thread(self.of, entry)

    def of(self, entry: ModelEntry) -> Facts:
        """The facts of ``entry``'s model (read from its file the first time)."""
        if entry.remote:
            return Facts("remote", digest=_digest("remote", entry.id, entry.url))
        try:
            resolved = resolve_model_path(entry)
        except ModelPathError:
            return Facts(entry.backend, digest=_digest(entry.backend, entry.id))
        path = Path(resolved)
        if entry.backend != "llamacpp" or not path.is_file():
            fmt = "mlx" if entry.backend == "mlx" else entry.backend
            return Facts(fmt, digest=_digest(fmt, entry.id, resolved))
        try:
            stat = path.stat()
        except OSError:
            return Facts("gguf", digest=_digest("gguf", entry.id, resolved))
        key = (resolved, stat.st_size, stat.st_mtime_ns, entry.chat_template_file)
        found = self._known.get(key)
        if found is None:
            found = self._read(entry, path, stat.st_size, stat.st_mtime)
            if len(self._known) >= _KEPT:
                self._known.clear()
            self._known[key] = found
        return found

    def _read(self, entry: ModelEntry, path: Path, size: int, mtime: float) -> Facts:
        digest = _digest(path, size, mtime)
        try:
            metadata = dict(read_header(path).metadata)
        except (GgufError, OSError) as error:
            log.warning("cannot read the GGUF header of %s: %s", path, error)
            return Facts("gguf", size, _stamp(mtime), digest)
        template = _own_template(entry)
        if template is None:
            found = metadata.get("tokenizer.chat_template")
            template = found if isinstance(found, str) else ""
        arch = metadata.get("general.architecture")
        family = arch if isinstance(arch, str) else None
        label = metadata.get("general.size_label")
        context = metadata.get(f"{family}.context_length") if family else None
        shown: dict[str, Any] = {}
        for name, value in metadata.items():
            if len(shown) >= MAX_MODEL_INFO:
                break
            if name.startswith("tokenizer.chat_template") or isinstance(value, GgufArray):
                continue
            shown[name] = list(value) if isinstance(value, tuple) else value
        projector = _projector_size(entry)
        return Facts(
            "gguf",
            size + projector,
            _stamp(mtime),
            digest,
            family,
            label if isinstance(label, str) else None,
            context if isinstance(context, int) and not isinstance(context, bool) else None,
            template,
            shown,
        )


def _own_template(entry: ModelEntry) -> str | None:
    """The registry's ``chat_template_file``, which the server is started with."""
    if entry.chat_template_file is None:
        return None
    try:
        path = Path(resolve_file_field("chat_template_file", entry.chat_template_file))
        with path.open("rb") as handle:
            return handle.read(MAX_TEMPLATE_BYTES).decode("utf-8", "replace")
    except (ModelPathError, OSError):
        return None


def _projector_size(entry: ModelEntry) -> int:
    if entry.mmproj_path is None:
        return 0
    try:
        return Path(resolve_file_field("mmproj_path", entry.mmproj_path)).stat().st_size
    except (ModelPathError, OSError):
        return 0


__all__ = ["THINKING_MARKS", "Facts", "ModelFacts"]
