"""Where each local model store lives, and how it lays its files out.

Every store's folder is found the way its own tool finds it (the environment variables
it reads, then its default under the home directory); a store whose folder does not
exist is simply absent. Walking a store yields :class:`Candidate` files: one per model,
with projector files (``mmproj*``) left out and a split model (``…-00001-of-00003.gguf``)
given once, as its first part with all its parts.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

HF: Final = "huggingface"
LMSTUDIO: Final = "lmstudio"
OLLAMA: Final = "ollama"
LLAMACPP: Final = "llama.cpp"
PROJECT: Final = "project"

OLLAMA_MODEL_LAYER: Final = "application/vnd.ollama.image.model"
_OLLAMA_HOST: Final = "registry.ollama.ai"
_SPLIT: Final = re.compile(r"^(?P<stem>.+)-(?P<part>\d{5})-of-(?P<count>\d{5})\.gguf$")
_DIGEST: Final = re.compile(r"^sha256:(?P<hex>[0-9a-f]{64})$")
_MAX_MANIFEST_BYTES: Final = 1 << 20


@dataclass(frozen=True)
class Place:
    """One store's folder on this machine."""

    store: str  # one of the names above
    root: Path


@dataclass(frozen=True)
class Candidate:
    """One model file found in a store: the name it is shown by and its files (a split
    model's parts in order, the first holding the header)."""

    name: str
    store: str
    parts: tuple[Path, ...]

    @property
    def path(self) -> Path:
        return self.parts[0]


def _home(env: Mapping[str, str]) -> Path:
    home = env.get("HOME")
    return Path(home) if home else Path.home()


def _user_cache(env: Mapping[str, str]) -> Path:
    """``$XDG_CACHE_HOME``, else ``~/.cache``."""
    xdg = env.get("XDG_CACHE_HOME")
    return Path(xdg).expanduser() if xdg else _home(env) / ".cache"


def hf_hub_cache(env: Mapping[str, str]) -> Path:
    """huggingface_hub's cache: ``$HF_HUB_CACHE`` (or the older
    ``$HUGGINGFACE_HUB_CACHE``), else ``$HF_HOME/hub``, else
    ``$XDG_CACHE_HOME/huggingface/hub`` or ``~/.cache/huggingface/hub``."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(name):
            return Path(env[name]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    return _user_cache(env) / "huggingface" / "hub"


def lmstudio_models(env: Mapping[str, str]) -> list[Path]:
    """LM Studio's models folders: the home named by ``~/.lmstudio-home-pointer`` (which
    LM Studio writes when its home moved), ``~/.lmstudio/models``, and the older
    ``~/.cache/lm-studio/models``."""
    home = _home(env)
    found = []
    pointer = home / ".lmstudio-home-pointer"
    try:
        named = pointer.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        named = ""
    if named:
        found.append(Path(named).expanduser() / "models")
    found += [home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"]
    return found


def ollama_models(env: Mapping[str, str]) -> Path:
    """``$OLLAMA_MODELS``, else ``~/.ollama/models``."""
    if env.get("OLLAMA_MODELS"):
        return Path(env["OLLAMA_MODELS"]).expanduser()
    return _home(env) / ".ollama" / "models"


def llamacpp_cache(env: Mapping[str, str]) -> Path:
    """``$LLAMA_CACHE``, else ``~/Library/Caches/llama.cpp`` on macOS and
    ``$XDG_CACHE_HOME/llama.cpp`` or ``~/.cache/llama.cpp`` elsewhere (llama.cpp's
    ``fs_get_cache_directory``)."""
    if env.get("LLAMA_CACHE"):
        return Path(env["LLAMA_CACHE"]).expanduser()
    if sys.platform == "darwin":
        return _home(env) / "Library" / "Caches" / "llama.cpp"
    return _user_cache(env) / "llama.cpp"


def places(env: Mapping[str, str], project_models: Path) -> list[Place]:
    """The stores whose folders exist, each folder once, in the order listed."""
    wanted = [
        Place(HF, hf_hub_cache(env)),
        *(Place(LMSTUDIO, p) for p in lmstudio_models(env)),
        Place(OLLAMA, ollama_models(env)),
        Place(LLAMACPP, llamacpp_cache(env)),
        Place(PROJECT, project_models),
    ]
    seen: set[Path] = set()
    found = []
    for place in wanted:
        try:
            key = place.root.resolve()
            exists = place.root.is_dir()
        except OSError:
            continue
        if exists and key not in seen:
            seen.add(key)
            found.append(place)
    return found


def candidates(place: Place) -> Iterator[Candidate]:
    """The models in one store, in name order."""
    if place.store == OLLAMA:
        found = list(_ollama(place.root))
    elif place.store == HF:
        found = list(_huggingface(place.root))
    else:
        prefix = {LMSTUDIO: "lmstudio:", LLAMACPP: "llama.cpp:", PROJECT: "models/"}
        found = [
            Candidate(prefix[place.store] + _relative(parts[0], place.root), place.store, parts)
            for parts in models_among(_ggufs(place.root))
        ]
    yield from sorted(found, key=lambda c: c.name)


def _relative(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


def _ggufs(root: Path) -> list[Path]:
    """The ``.gguf`` files under ``root`` (symlinks to files count; hidden folders,
    such as an unfinished download's, do not)."""
    try:
        return [
            p
            for p in root.rglob("*.gguf")
            if p.is_file() and not any(s.startswith(".") for s in p.relative_to(root).parts)
        ]
    except OSError:
        return []


def models_among(paths: list[Path]) -> list[tuple[Path, ...]]:
    """The model files among ``paths``: projectors dropped, a split model's parts
    gathered under its first part (a split model missing its first part is dropped)."""
    models: list[tuple[Path, ...]] = []
    splits: dict[tuple[Path, str, str], list[Path]] = {}
    for path in sorted(paths):
        if path.name.lower().startswith("mmproj"):
            continue
        split = _SPLIT.match(path.name)
        if split is None:
            models.append((path,))
        else:
            key = (path.parent, split["stem"], split["count"])
            splits.setdefault(key, []).append(path)
    for parts in splits.values():
        first = _SPLIT.match(parts[0].name)
        if first is not None and int(first["part"]) == 1:
            models.append(tuple(parts))
    return models


def _huggingface(root: Path) -> Iterator[Candidate]:
    """``models--{owner}--{repo}/snapshots/{revision}/{file}.gguf``, shown as
    ``owner/repo/file.gguf`` (with the revision when several snapshots hold it)."""
    for repo in sorted(root.glob("models--*")):
        owner_repo = repo.name.removeprefix("models--").replace("--", "/", 1)
        snapshots = sorted(p for p in (repo / "snapshots").glob("*") if p.is_dir())
        names: dict[str, list[tuple[Path, ...]]] = {}
        for snapshot in snapshots:
            for parts in models_among(_ggufs(snapshot)):
                names.setdefault(_relative(parts[0], snapshot), []).append(parts)
        for name, found in names.items():
            for parts in found:
                shown = f"{owner_repo}/{name}"
                if len(found) > 1:
                    shown += f"@{parts[0].relative_to(repo / 'snapshots').parts[0][:8]}"
                yield Candidate(shown, HF, parts)


def _ollama(root: Path) -> Iterator[Candidate]:
    """``manifests/{host}/{namespace}/{model}/{tag}``, whose model layer's digest
    ``sha256:<hex>`` names the blob ``blobs/sha256-<hex>``; shown as
    ``ollama:model:tag`` (``namespace/model`` outside ``library``, ``host/…`` off
    Ollama's own registry)."""
    manifests = root / "manifests"
    for manifest in sorted(p for p in manifests.glob("*/*/*/*") if p.is_file()):
        host, namespace, model, tag = manifest.relative_to(manifests).parts
        digest = _model_digest(manifest)
        if digest is None:
            continue
        blob = root / "blobs" / f"sha256-{digest}"
        if not blob.is_file():
            continue
        name = model if namespace == "library" else f"{namespace}/{model}"
        if host != _OLLAMA_HOST:
            name = f"{host}/{name}"
        yield Candidate(f"ollama:{name}:{tag}", OLLAMA, (blob,))


def _model_digest(manifest: Path) -> str | None:
    """The hex digest of the manifest's model layer; None for anything unreadable."""
    try:
        with manifest.open("rb") as handle:
            data = json.loads(handle.read(_MAX_MANIFEST_BYTES))
    except (OSError, ValueError):
        return None
    layers = data.get("layers") if isinstance(data, dict) else None
    for layer in layers if isinstance(layers, list) else ():
        if isinstance(layer, dict) and layer.get("mediaType") == OLLAMA_MODEL_LAYER:
            match = _DIGEST.match(str(layer.get("digest", "")))
            return match["hex"] if match else None
    return None


__all__ = [
    "Candidate",
    "Place",
    "candidates",
    "hf_hub_cache",
    "llamacpp_cache",
    "lmstudio_models",
    "models_among",
    "ollama_models",
    "places",
]
