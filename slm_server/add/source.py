"""The file ``add`` is given: a path to a GGUF file, or a model's name as
``python -m slm_server models`` lists it (found in the same places, served in place)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from slm_server.discover.places import Candidate, candidates, places


class NotFound(Exception):
    """Neither a file nor a listed name; the message says so."""


@dataclass(frozen=True)
class Source:
    """The model file to serve and the name it came by (a listed name, or the file's)."""

    path: Path
    name: str
    store: str | None  # the discovery store it was found in; None for a plain path

    def candidate(self) -> Candidate:
        return Candidate(self.name, self.store or "file", (self.path,))


def find_listed(given: str, env: Mapping[str, str], project_models: Path) -> Source | None:
    """The model ``python -m slm_server models`` lists as ``given``; None when none is."""
    for place in places(env, project_models):
        for found in candidates(place):
            if found.name == given:
                return Source(found.path.absolute(), found.name, found.store)
    return None


def find_source(given: str, env: Mapping[str, str], project_models: Path) -> Source:
    """``given`` as a file (absolute, symlinks kept), else as a listed name; raises
    :class:`NotFound`."""
    path = Path(given).expanduser()
    if path.is_file():
        return Source(path.absolute(), path.name, None)
    if path.exists():
        raise NotFound(f"{given} is not a file (give a GGUF file or a name `models` lists)")
    listed = find_listed(given, env, project_models)
    if listed is not None:
        return listed
    raise NotFound(
        f"no file and no model named {given!r} (`python -m slm_server models` lists the names)"
    )


__all__ = ["NotFound", "Source", "find_listed", "find_source"]
