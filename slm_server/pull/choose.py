"""Which files of a repository a reference means: the model (all its parts when the
GGUF is split), and the vision projector (``mmproj``) beside it when there is one.

Without a quantization the usual default is taken (``Q4_K_M``, then the next in
:data:`PREFERRED`); a repository with several and none of those is ambiguous, and the
error lists what it holds.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Final

from slm_server.pull.errors import PullError
from slm_server.pull.reference import safe_relative

PREFERRED: Final = ("Q4_K_M", "Q4_0", "Q4_K_S", "Q5_K_M", "Q8_0", "MXFP4", "F16", "BF16")
PROJECTOR_PREFERRED: Final = ("F16", "BF16", "Q8_0", "F32")
LISTED: Final = 20  # names an error message shows at most (a hub may list thousands)
_SPLIT: Final = re.compile(r"^(?P<stem>.+)-(?P<part>\d{5})-of-(?P<count>\d{5})\.gguf$", re.I)
_QUANT_TOKEN: Final = re.compile(
    r"(?:^|[-_.])(?P<q>(?:I?Q\d(?:_[A-Z0-9]+)*)|(?:U?BF16|F16|F32|FP16|MXFP4(?:_MOE)?|TQ\d_\d))(?=$|[-_.])",
    re.I,
)


@dataclass(frozen=True)
class RemoteFile:
    """One file a hub lists: its path in the repository, size, and SHA-256 when the
    hub gives one (large files always have it)."""

    path: str
    size: int
    sha256: str | None = None


@dataclass(frozen=True)
class Choice:
    """The files to fetch: the model's parts in order, and its projector."""

    parts: tuple[RemoteFile, ...]
    projector: RemoteFile | None
    quant: str | None

    @property
    def files(self) -> tuple[RemoteFile, ...]:
        return self.parts + ((self.projector,) if self.projector else ())


def quant_of(path: str) -> str | None:
    """The quantization named in a file's name (``…-Q4_K_M.gguf`` → ``Q4_K_M``)."""
    stem = _SPLIT.sub(r"\g<stem>", PurePosixPath(path).name)
    stem = re.sub(r"\.gguf$", "", stem, flags=re.I)
    found = [m["q"].upper() for m in _QUANT_TOKEN.finditer(stem)]
    return found[-1] if found else None


def _is_projector(path: str) -> bool:
    return "mmproj" in PurePosixPath(path).name.lower()


def _models(files: Sequence[RemoteFile]) -> list[tuple[RemoteFile, ...]]:
    """Each model among ``files``: a single GGUF, or a split one's parts in order (a
    split missing a part is left out)."""
    singles: list[tuple[RemoteFile, ...]] = []
    splits: dict[tuple[str, str, str], list[RemoteFile]] = {}
    for f in sorted(files, key=lambda f: f.path):
        if not f.path.lower().endswith(".gguf") or _is_projector(f.path):
            continue
        name = PurePosixPath(f.path)
        split = _SPLIT.match(name.name)
        if split is None:
            singles.append((f,))
        else:
            splits.setdefault((str(name.parent), split["stem"], split["count"]), []).append(f)
    for (_, _, count), parts in splits.items():
        numbers = [int(m["part"]) for p in parts if (m := _SPLIT.match(PurePosixPath(p.path).name))]
        if numbers == list(range(1, int(count) + 1)):
            singles.append(tuple(parts))
    return singles


def _projector(files: Sequence[RemoteFile], model: RemoteFile) -> RemoteFile | None:
    """The projector beside the model (same folder first), its preferred precision first."""
    folder = str(PurePosixPath(model.path).parent)
    found = [f for f in files if f.path.lower().endswith(".gguf") and _is_projector(f.path)]
    if not found:
        return None

    def rank(f: RemoteFile) -> tuple[int, int, str]:
        q = quant_of(f.path)
        near = 0 if str(PurePosixPath(f.path).parent) == folder else 1
        order = (
            PROJECTOR_PREFERRED.index(q) if q in PROJECTOR_PREFERRED else len(PROJECTOR_PREFERRED)
        )
        return (near, order, f.path)

    return min(found, key=rank)


def _names(names: Sequence[str]) -> str:
    """``names`` for an error message: the first :data:`LISTED` of them, then a count."""
    shown = ", ".join(names[:LISTED]) or "no GGUF file"
    more = len(names) - LISTED
    return f"{shown} and {more} more" if more > 0 else shown


def _listing(models: list[tuple[RemoteFile, ...]]) -> str:
    return _names(sorted(quant_of(m[0].path) or m[0].path for m in models))


def choose(repo: str, files: Sequence[RemoteFile], quant: str | None, file: str | None) -> Choice:
    """The files ``quant`` or ``file`` (or neither) means in ``repo``; raises
    :class:`PullError` (``not_found``, ``ambiguous``, ``unsafe_name``)."""
    models = _models(files)
    if file is not None:
        picked = [m for m in models if m[0].path == file]
        if not picked:
            listed = _names([m[0].path for m in models])
            raise PullError("not_found", f"{repo} has no model file {file} (it holds: {listed})")
    elif quant is not None:
        want = quant.upper().replace("-", "_")
        picked = [m for m in models if (quant_of(m[0].path) or "").replace("-", "_") == want]
        if not picked:
            raise PullError(
                "not_found", f"{repo} has no {quant} file (it holds: {_listing(models)})"
            )
    elif len(models) == 1:
        picked = models
    else:
        if not models:
            raise PullError("not_found", f"{repo} holds no GGUF model file")
        by_quant = {quant_of(m[0].path): m for m in models}
        preferred = [q for q in PREFERRED if q in by_quant]
        if not preferred:
            raise PullError(
                "ambiguous",
                f"{repo} holds several models; name one as {repo}:QUANT ({_listing(models)})",
            )
        picked = [m for m in models if quant_of(m[0].path) == preferred[0]]
    if len(picked) > 1:
        paths = _names([m[0].path for m in picked])
        raise PullError("ambiguous", f"{repo}: several files match ({paths}); name the file")
    parts = picked[0]
    projector = _projector(files, parts[0])
    for f in parts + ((projector,) if projector else ()):
        safe_relative(f.path)
    return Choice(parts, projector, quant_of(parts[0].path))


__all__ = ["PREFERRED", "Choice", "RemoteFile", "choose", "quant_of"]
