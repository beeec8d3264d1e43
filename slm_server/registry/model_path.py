"""Where a registry entry's files are: ``model_path`` and the other path fields.

``model_path`` is either a local path (a ``.gguf`` file, or a directory; for llama.cpp
the directory's first ``.gguf`` alphabetically, skipping ``mmproj*`` projector files) or,
for MLX only, a Hugging Face model id such as ``mlx-community/Qwen3-8B-MLX-8bit``.
Relative paths are taken from the project root. A missing path is reported at once;
nothing here waits for a volume to appear.
"""

from __future__ import annotations

import re
from pathlib import Path

from slm_server.registry.schema import ModelEntry
from slm_server.settings import PROJECT_ROOT

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class ModelPathError(Exception):
    """A path field of an entry cannot be used; ``missing`` when it does not exist."""

    def __init__(self, field: str, message: str, *, missing: bool = False) -> None:
        super().__init__(message)
        self.field = field
        self.message = message
        self.missing = missing


def project_path(raw: str, root: Path = PROJECT_ROOT) -> Path:
    """``raw`` with ``~`` expanded, relative paths taken from ``root``."""
    path = Path(raw).expanduser()
    return path if path.is_absolute() else root / path


def looks_like_hub_id(raw: str, root: Path = PROJECT_ROOT) -> bool:
    """True for ``owner/name`` strings that are not an existing local path."""
    if raw.startswith((".", "/", "~")) or raw.endswith(".gguf"):
        return False
    return bool(_HUB_ID.match(raw)) and not project_path(raw, root).exists()


def first_gguf(directory: Path) -> Path | None:
    """The directory's first model ``.gguf`` alphabetically (projectors skipped)."""
    candidates = sorted(
        p
        for p in directory.iterdir()
        if p.suffix == ".gguf" and p.is_file() and not p.name.startswith("mmproj")
    )
    return candidates[0] if candidates else None


def resolve_model_path(entry: ModelEntry, root: Path = PROJECT_ROOT) -> str:
    """The path (or hub id) to hand to the backend; raises :class:`ModelPathError`."""
    raw = entry.model_path
    if looks_like_hub_id(raw, root):
        if entry.backend == "llamacpp":
            raise ModelPathError(
                "model_path",
                f"'{raw}' is neither a local file nor a directory; Hugging Face model "
                "ids work for backend mlx only, llamacpp needs a local .gguf file or a "
                "directory holding one",
            )
        return raw
    path = project_path(raw, root)
    if not path.exists():
        raise ModelPathError("model_path", f"{path} does not exist", missing=True)
    if entry.backend != "llamacpp":
        return str(path)
    if path.is_dir():
        found = first_gguf(path)
        if found is None:
            raise ModelPathError("model_path", f"directory {path} holds no .gguf file")
        return str(found)
    if path.suffix != ".gguf":
        raise ModelPathError("model_path", f"{path} is not a .gguf file")
    return str(path)


def resolve_file_field(field: str, raw: str, root: Path = PROJECT_ROOT) -> str:
    """A path field that must name an existing file (templates, projectors, drafts)."""
    path = project_path(raw, root)
    if not path.exists():
        raise ModelPathError(field, f"{path} does not exist", missing=True)
    if not path.is_file():
        raise ModelPathError(field, f"{path} is not a file")
    return str(path)
