"""A memory source the test sets: the machine's free memory as a number, or ``None``
(no reading). For a router in-process; a router process reads
``SLM_MEMORY_SIMULATED_FILE`` instead (:func:`write_simulated`)."""

from __future__ import annotations

import os
from pathlib import Path

from slm_server.memory.available import SIMULATED_MARK

PLENTY_MB = 1 << 20  # 1 TiB: never below any floor


class ScriptedMemory:
    """``available_mb`` answers what the test put in ``free_mb``."""

    name = "scripted"

    def __init__(self, free_mb: int | None = PLENTY_MB) -> None:
        self.free_mb = free_mb
        self.reads = 0

    def available_mb(self) -> int | None:
        self.reads += 1
        return self.free_mb


def write_simulated(path: Path, free_mb: int) -> None:
    """Write the simulated free memory in one step (temp file + rename), so a reader
    never sees half of it."""
    temp = path.with_name(path.name + ".tmp")
    temp.write_text(f"{SIMULATED_MARK} {free_mb}\n", encoding="utf-8")
    os.replace(temp, path)
