"""The memory a running backend really holds: the resident set of its process tree.

``resident_mb`` adds up the RSS of a process and all its descendants (a Python server
may fork workers; ``mlx-openai-server`` runs its model in a child process). A process
that exits during the walk is skipped; one we may not inspect is skipped too.

What RSS counts, and what it does not:

- Linux: anonymous memory plus the resident pages of mapped files. llama.cpp maps the
  GGUF file, so its weights count once they have been touched (they are, by the
  warm-up before ``/health`` answers); they are page cache the kernel may reclaim and
  re-read under pressure, which makes RSS an upper bound of what the backend pins.
- macOS: RSS is what the kernel reports for the task. Memory a process allocates
  through Metal (MLX arrays, llama.cpp's Metal buffers and KV cache) is GPU-wired
  memory that RSS does not show; the only counter that does, the task's
  ``phys_footprint`` (psutil's ``memory_full_info``), needs task-port rights and is
  not worth the fragility. So on macOS a measurement can undercount:
  :data:`RSS_COUNTS_GPU_MEMORY` is ``False`` there, and a caller should keep the
  larger of the measurement and the estimate.

Shared pages (libraries, a file two backends map) count in each process, so a sum
of footprints can exceed what the machine uses: this errs on the side of caution.
"""

from __future__ import annotations

import sys
from typing import Final

import psutil

MIB: Final = 1 << 20

# Whether RSS includes what the process allocates on the GPU (Metal on macOS: no).
RSS_COUNTS_GPU_MEMORY: Final = sys.platform != "darwin"


def _rss(process: psutil.Process) -> int | None:
    try:
        return int(process.memory_info().rss)
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def resident_bytes(pid: int) -> int | None:
    """The RSS of ``pid`` and all its descendants in bytes; ``None`` when ``pid`` is
    gone or not ours to inspect."""
    try:
        root = psutil.Process(pid)
        children = root.children(recursive=True)
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None
    total = _rss(root)
    if total is None:
        return None
    for child in children:
        total += _rss(child) or 0
    return total


def resident_mb(pid: int) -> int | None:
    """:func:`resident_bytes` in MiB, rounded up."""
    nbytes = resident_bytes(pid)
    return None if nbytes is None else -(-nbytes // MIB)
