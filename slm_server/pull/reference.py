"""What ``pull`` is asked for, parsed without touching the network.

* Hugging Face: ``owner/repo``, ``owner/repo:Q4_K_M`` (a quantization), or
  ``owner/repo/path/file.gguf`` (a file); a revision as ``owner/repo@rev``; an optional
  ``hf:``, ``hf.co/`` or ``https://huggingface.co/`` in front.
* Ollama: ``ollama:model``, ``ollama:model:tag`` or ``ollama:namespace/model:tag`` (the
  tag defaults to ``latest``, the namespace to ``library``).

Every name part is checked here against the hub's own alphabet, so that nothing a
reference holds can climb out of the models folder (``../``, an absolute path, a
backslash) once it becomes a path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from slm_server.pull.errors import PullError

_REPO_PART: Final = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9_-])?$")
_REVISION: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,254}$")
_QUANT: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_OLLAMA_NAME: Final = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")
_OLLAMA_TAG: Final = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
_HF_PREFIXES: Final = (
    "hf:",
    "https://huggingface.co/",
    "http://huggingface.co/",
    "huggingface.co/",
    "hf.co/",
)


@dataclass(frozen=True)
class HfReference:
    """A Hugging Face repository and what to take from it."""

    repo_id: str  # owner/repo
    revision: str | None = None
    quant: str | None = None
    file: str | None = None  # a path inside the repository

    def __str__(self) -> str:
        at = f"@{self.revision}" if self.revision else ""
        if self.file:
            return f"{self.repo_id}{at}/{self.file}"
        return f"{self.repo_id}{at}" + (f":{self.quant}" if self.quant else "")


@dataclass(frozen=True)
class OllamaReference:
    """A model in an Ollama registry."""

    namespace: str
    model: str
    tag: str

    def __str__(self) -> str:
        name = self.model if self.namespace == "library" else f"{self.namespace}/{self.model}"
        return f"ollama:{name}:{self.tag}"


Reference = HfReference | OllamaReference


def safe_relative(path: str) -> str:
    """``path`` if it is a plain relative path (no ``..``, ``.`` or empty part, no
    leading ``/``, no backslash, drive, control or other unprintable character: a
    bidirectional override, a zero-width space); raises
    :class:`PullError` ``unsafe_name`` otherwise."""
    bad = (
        not path
        or len(path) > 1024
        or path.startswith("/")
        or "\\" in path
        or not path.isprintable()
        or re.match(r"^[A-Za-z]:", path) is not None
        or any(part in ("", ".", "..") for part in path.split("/"))
    )
    if bad:
        raise PullError("unsafe_name", f"refused the file name {path!r}: not a plain relative path")
    return path


def _bad(text: str, why: str) -> PullError:
    return PullError("bad_reference", f"{text!r} is not a model reference: {why}")


def _ollama(text: str, rest: str) -> OllamaReference:
    name, _, tag = rest.partition(":")
    namespace, slash, model = name.rpartition("/")
    if not slash:
        namespace = "library"
    if not _OLLAMA_NAME.match(model) or not _OLLAMA_NAME.match(namespace):
        raise _bad(text, "an Ollama name is ollama:model[:tag] or ollama:namespace/model[:tag]")
    tag = tag or "latest"
    if not _OLLAMA_TAG.match(tag):
        raise _bad(text, f"{tag!r} is not an Ollama tag")
    return OllamaReference(namespace, model, tag)


def _hf(text: str, rest: str) -> HfReference:
    parts = rest.split("/")
    if len(parts) < 2:
        raise _bad(text, "expected owner/repo, owner/repo:QUANT or owner/repo/file.gguf")
    owner, repo_part, file_parts = parts[0], parts[1], parts[2:]
    quant: str | None = None
    if not file_parts and ":" in repo_part:
        repo_part, _, quant = repo_part.partition(":")
        if not _QUANT.match(quant):
            raise _bad(text, f"{quant!r} is not a quantization (such as Q4_K_M)")
    repo, _, revision = repo_part.partition("@")
    for part in (owner, repo):
        if not _REPO_PART.match(part) or ".." in part or "--" in part:
            raise _bad(text, f"{part!r} is not a Hugging Face owner or repository name")
    if revision and (not _REVISION.match(revision) or ".." in revision):
        raise _bad(text, f"{revision!r} is not a revision")
    file = "/".join(file_parts) or None
    if file is not None:
        try:
            safe_relative(file)
        except PullError as exc:
            raise PullError("unsafe_name", f"{text!r}: {exc}") from None
        if not file.lower().endswith(".gguf"):
            raise _bad(text, f"{file!r} is not a .gguf file")
    return HfReference(f"{owner}/{repo}", revision or None, quant, file)


def parse_reference(text: str) -> Reference:
    """The reference ``text`` names; raises :class:`PullError` ``bad_reference`` (or
    ``unsafe_name`` for a file path that climbs)."""
    stripped = text.strip()
    if not stripped or len(stripped) > 512:
        raise _bad(text, "empty or too long")
    if stripped.startswith("ollama:"):
        return _ollama(text, stripped.removeprefix("ollama:"))
    for prefix in _HF_PREFIXES:
        if stripped.startswith(prefix):
            stripped = stripped.removeprefix(prefix)
            break
    if "://" in stripped:
        raise _bad(text, "only Hugging Face (owner/repo) and Ollama (ollama:name) are known")
    return _hf(text, stripped.strip("/"))


__all__ = [
    "HfReference",
    "OllamaReference",
    "Reference",
    "parse_reference",
    "safe_relative",
]
