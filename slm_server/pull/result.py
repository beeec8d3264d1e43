"""What a finished pull put on the disk."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pulled:
    reference: str
    parts: tuple[Path, ...]  # the model's files; the first holds the header
    projector: Path | None = None
    extras: tuple[Path, ...] = ()  # what else came with it (Ollama's template, params)
    fetched_bytes: int = 0

    @property
    def model(self) -> Path:
        return self.parts[0]


__all__ = ["Pulled"]
