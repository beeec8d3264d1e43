"""The values of the entry ``add`` writes, decided from the file's facts and the
registry it joins; no I/O here (what is free and what fits are asked of callables).

- ``id``: the file's name (or the listed name) lower-cased, every run of characters
  other than ``a-z 0-9 . _ -`` made one ``-``, the ``.gguf`` suffix and a split
  model's ``-00001-of-00003`` dropped (``Qwen3-0.6B-Q8_0.gguf`` is ``qwen3-0.6b-q8_0``,
  ``ollama:qwen3:0.6b`` is ``qwen3-0.6b``); the role is the id with ``.`` made ``-``
  (a dot in a role names a replica).
- ``port``: the first port above every port the registry's entries use (a replica's
  included; 8501 when none) that is free on 127.0.0.1.
- ``context_length``: the trained context if it fits the memory budget, else the first
  of its halves that does, down to :data:`MIN_CONTEXT` (kept even when that does not
  fit: the caller says so).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

MIN_CONTEXT: Final = 2048
FIRST_PORT: Final = 8501
LAST_PORT: Final = 65535
CHAT_TIMEOUT: Final = 120
EMBEDDING_TIMEOUT: Final = 60
# llama_pooling_type (include/llama.h) as the registry's ``pooling`` names it.
POOLING_NAMES: Final[Mapping[int, str]] = {1: "mean", 2: "cls", 3: "last"}
_STORE_PREFIXES: Final = ("ollama:", "lmstudio:", "llama.cpp:")
_SPLIT: Final = re.compile(r"-\d{5}-of-\d{5}$")
_UNSAFE: Final = re.compile(r"[^a-z0-9._-]+")


class NoPort(Exception):
    """No free port above the registry's."""


def model_id(name: str) -> str:
    """The id for a model shown as ``name`` (a file name or a listed name)."""
    for prefix in _STORE_PREFIXES:
        name = name.removeprefix(prefix)
    base = name.rsplit("/", 1)[-1].split("@", 1)[0]  # a Hugging Face name's "@revision"
    if base.lower().endswith(".gguf"):
        base = base[: -len(".gguf")]
    slug = _UNSAFE.sub("-", _SPLIT.sub("", base).lower()).strip("-._")
    return slug or "model"


def role_for(model_id: str) -> str:
    """The YAML key for an entry of ``model_id``: safe characters, no dot."""
    return _UNSAFE.sub("-", model_id.lower()).replace(".", "-").strip("-_") or "model"


def taken(model_id: str, role: str, entries: Mapping[str, Any]) -> str | None:
    """Why ``model_id`` or ``role`` cannot be added beside ``entries`` (the registry's
    ``models`` mapping as read), or None."""
    if role in entries:
        return f"the role {role!r} is already in the registry"
    for other, raw in entries.items():
        if isinstance(raw, dict) and raw.get("id") == model_id:
            return f"the id {model_id!r} is already taken by {other!r}"
    return None


def used_ports(entries: Mapping[str, Any]) -> set[int]:
    """Every port the local entries name (each replica's), enabled or not."""
    ports: set[int] = set()
    for raw in entries.values():
        if not isinstance(raw, dict) or raw.get("backend") == "remote":
            continue
        port, replicas = raw.get("port"), raw.get("replicas", 1)
        if isinstance(port, int) and not isinstance(port, bool):
            count = replicas if isinstance(replicas, int) and replicas > 0 else 1
            ports.update(range(port, port + count))
    return ports


def next_port(used: Iterable[int], is_free: Callable[[int], bool]) -> int:
    """The first port above ``used`` (from :data:`FIRST_PORT` when empty) that
    ``is_free``; raises :class:`NoPort`."""
    taken_ports = set(used)
    start = max(taken_ports, default=FIRST_PORT - 1) + 1
    for port in range(start, LAST_PORT + 1):
        if port not in taken_ports and is_free(port):
            return port
    raise NoPort(f"no free port above {start - 1}: give one with --port")


def contexts_to_try(trained: int) -> list[int]:
    """The trained context, then its halves down to :data:`MIN_CONTEXT`."""
    if trained <= MIN_CONTEXT:
        return [trained]
    found = []
    context = trained
    while context > MIN_CONTEXT:
        found.append(context)
        context //= 2
    return [*found, MIN_CONTEXT]


@dataclass(frozen=True)
class Fit:
    """The context chosen and the footprint at it; ``fits`` False when even the
    smallest tried is over the budget."""

    context: int
    needed_mb: int
    fits: bool


def fit_context(trained: int, needs_mb: Callable[[int], int], budget_mb: int) -> Fit:
    """The largest context of :func:`contexts_to_try` whose footprint ``needs_mb``
    is within ``budget_mb``; the smallest, not fitting, when none is."""
    needed = 0
    context = trained
    for context in contexts_to_try(trained):
        needed = needs_mb(context)
        if needed <= budget_mb:
            return Fit(context, needed, True)
    return Fit(context, needed, False)


def model_path_text(path: Path, root: Path) -> str:
    """``path`` relative to the project ``root`` when inside it, else absolute."""
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return str(path)


def entry_fields(
    *,
    model_id: str,
    port: int,
    model_path: str,
    quantization: str | None,
    kind: str,
    pooling: int | None,
    context: int | None,
    load: str,
    chat_template_file: str | None = None,
) -> dict[str, Any]:
    """The entry, in the order the example registry writes its fields. ``kind`` is
    ``chat``, ``embeddings`` or ``rerank``; ``pooling`` the file's pooling type."""
    fields: dict[str, Any] = {
        "id": model_id,
        "backend": "llamacpp",
        "port": port,
        "model_path": model_path,
        "default_timeout": CHAT_TIMEOUT if kind == "chat" else EMBEDDING_TIMEOUT,
        "quantization": quantization or "unknown",
    }
    if chat_template_file is not None:
        fields["chat_template_file"] = chat_template_file
    if kind in ("embeddings", "rerank"):
        fields["model_type"] = kind
    if kind == "embeddings":  # the file's pooling, else mean (llama-server needs one)
        fields["pooling"] = POOLING_NAMES.get(pooling or 0, "mean")
    if context is not None:
        fields["context_length"] = context
    fields["load"] = load
    return fields


__all__ = [
    "MIN_CONTEXT",
    "Fit",
    "NoPort",
    "contexts_to_try",
    "entry_fields",
    "fit_context",
    "model_id",
    "model_path_text",
    "next_port",
    "role_for",
    "taken",
    "used_ports",
]
