"""The machine's memory, and the share of it models may use by default.

``default_budget_mb`` is what ``SLM_MEMORY_BUDGET_MB`` defaults to::

    budget = max(FLOOR_MB, min(total * 3/4, total - RESERVE_MB))

Three quarters of physical memory, but always leaving ``RESERVE_MB`` (2 GiB) to the
OS, the gateway itself and the user's other work; on a small machine, where those
rules leave almost nothing, never less than ``FLOOR_MB`` (512 MiB: one small model),
capped at the machine's total. On Apple Silicon the share is also about what macOS
lets the GPU wire by default (two thirds to three quarters of memory), the ceiling
for MLX and Metal models anyway.

``default_floor_mb`` is what ``SLM_MEMORY_FLOOR_MB`` (the least free memory the
machine keeps, see :mod:`slm_server.router.ondemand.memory_pressure`) defaults to:
1 GiB, an eighth of the machine when that is less.
"""

from __future__ import annotations

import os
from typing import Final

import psutil

MIB: Final = 1 << 20
SHARE: Final = 0.75
RESERVE_MB: Final = 2048
FLOOR_MB: Final = 512


def physical_memory_mb() -> int:
    """The machine's physical memory in MiB (sysconf on Linux and macOS, else psutil)."""
    try:
        pages = os.sysconf("SC_PHYS_PAGES")
        page_size = os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        pages = page_size = -1
    if pages > 0 and page_size > 0:
        return pages * page_size // MIB
    return int(psutil.virtual_memory().total) // MIB


def default_budget_mb(total_mb: int) -> int:
    """The default memory budget for models on a machine of ``total_mb`` MiB."""
    if total_mb <= 0:
        raise ValueError(f"physical memory must be positive, not {total_mb} MiB")
    budget = min(int(total_mb * SHARE), total_mb - RESERVE_MB)
    return min(max(budget, FLOOR_MB), total_mb)


FREE_FLOOR_MB: Final = 1024
FREE_FLOOR_SHARE: Final = 8  # at most this fraction (1/8) of a small machine


def default_floor_mb(total_mb: int) -> int:
    """The default memory floor (``SLM_MEMORY_FLOOR_MB``): 1 GiB, or an eighth of a
    machine smaller than 8 GiB. Half of :data:`RESERVE_MB`, the least the default budget
    leaves to the rest of the machine, so that a machine running little but the gateway
    with its budget full stays above it; low enough that reaching it means the machine
    is short (on Linux the OOM killer is near, on macOS the compressor and swap are at
    work)."""
    return min(FREE_FLOOR_MB, max(total_mb, 0) // FREE_FLOOR_SHARE)
