"""The models found on this machine, matched to the registry, as a table or as JSON.

An entry serves a found file when its resolved ``model_path`` is the same file (both
paths resolved, symlinks followed: a Hugging Face snapshot's link and its blob are one
file)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from slm_server.discover.found import Found, read_found
from slm_server.discover.places import Place, candidates
from slm_server.registry.model_path import ModelPathError, resolve_model_path
from slm_server.registry.schema import RegistryFile
from slm_server.settings import PROJECT_ROOT

COLUMNS = ("NAME", "SIZE", "QUANT", "CONTEXT", "TYPE", "SERVED AS", "PATH")


@dataclass(frozen=True)
class Listed:
    """A found model and the registry ids that serve its file."""

    found: Found
    served_as: tuple[str, ...]


def _same_file(path: Path | str) -> Path | None:
    try:
        return Path(path).resolve(strict=True)
    except (OSError, RuntimeError):  # missing, unreadable, or a symlink loop
        return None


def served_files(registry: RegistryFile | None, root: Path = PROJECT_ROOT) -> dict[Path, list[str]]:
    """The ids of the registry's llama.cpp entries by the file each resolves to."""
    served: dict[Path, list[str]] = {}
    for spec in registry.models if registry is not None else ():
        entry = spec.entry
        if entry.backend != "llamacpp" or entry.remote:
            continue
        try:
            path = _same_file(resolve_model_path(entry, root))
        except ModelPathError:
            continue
        if path is None:
            continue
        ids = served.setdefault(path, [])
        if entry.id not in ids:
            ids.append(entry.id)
    return served


def discover(found_places: Iterable[Place], served: Mapping[Path, list[str]]) -> list[Listed]:
    """Every model in ``found_places``, its header read, with the ids serving it."""
    listed = []
    for place in found_places:
        for candidate in candidates(place):
            path = _same_file(candidate.path)
            ids = served.get(path, []) if path is not None else []
            listed.append(Listed(read_found(candidate), tuple(ids)))
    return listed


def size_text(size: int) -> str:
    """``86M``, ``4.4G`` (MiB, GiB)."""
    mib = size / (1 << 20)
    if mib < 1024:
        return f"{mib:.0f}M" if mib >= 10 else f"{mib:.1f}M"
    return f"{mib / 1024:.1f}G"


def render_table(listed: list[Listed], looked_in: list[Place]) -> str:
    """The aligned table, or a sentence saying nothing was found and where we looked."""
    if not listed:
        where = ", ".join(str(p.root) for p in looked_in) or "none of the usual folders exists"
        return f"no GGUF models found (looked in: {where})"
    rows = [COLUMNS]
    for item in listed:
        f = item.found
        rows.append(
            (
                f.name,
                size_text(f.size),
                f.quantization or "?",
                str(f.context_length) if f.context_length is not None else "?",
                f.type or "?",
                ",".join(item.served_as) or "-",
                f.path,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def render_json(listed: list[Listed]) -> str:
    """A JSON list, one object per model (``size`` in bytes, null where unknown)."""
    return json.dumps(
        [{**asdict(item.found), "served_as": list(item.served_as)} for item in listed], indent=2
    )


__all__ = ["COLUMNS", "Listed", "discover", "render_json", "render_table", "served_files"]
