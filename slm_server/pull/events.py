"""What a pull reports as it goes, to the terminal (``progress_view``) or the API's
event stream; each event is also a plain JSON object (:func:`as_json`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class PlannedFile:
    name: str  # where it goes, relative to the models folder
    size: int
    sha256: str | None
    present: bool  # already there with the right checksum: not fetched again


@dataclass(frozen=True)
class Planned:
    """The files a reference means, before any is fetched."""

    reference: str
    files: tuple[PlannedFile, ...]
    to_fetch_bytes: int
    free_bytes: int


@dataclass(frozen=True)
class Progress:
    """Bytes of one file so far (``resumed`` of them from an earlier, interrupted pull)."""

    name: str
    done: int
    total: int | None
    resumed: int
    bytes_per_second: float | None
    seconds_left: float | None


@dataclass(frozen=True)
class FileReady:
    """A file checked and under its final name (``fetched`` False: it was already)."""

    name: str
    path: Path
    fetched: bool


Event = Planned | Progress | FileReady
Report = Callable[[Event], None]

_TYPES: dict[type, str] = {Planned: "planned", Progress: "progress", FileReady: "file"}


def as_json(event: Event) -> dict[str, Any]:
    """``event`` as a JSON object with its ``type``."""
    body = asdict(event)
    if isinstance(event, FileReady):
        body["path"] = str(event.path)
    return {"type": _TYPES[type(event)], **body}


def ignore(event: Event) -> None:
    """A report that shows nothing."""


__all__ = [
    "Event",
    "FileReady",
    "Planned",
    "PlannedFile",
    "Progress",
    "Report",
    "as_json",
    "ignore",
]
