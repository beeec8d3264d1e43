"""Giving the memory of large bodies back to the operating system once their requests
end.

Python frees a parsed body as soon as its request lets go of it, but the C allocator
keeps what it freed for later: glibc's ``malloc`` keeps large freed blocks in its heap
(its threshold for giving big blocks their own mapping rises as they are freed), so a
router that once held a few hundred MiB of bodies would go on holding them. After a
request that held at least :data:`THRESHOLD_BYTES` of the body budget ends, the router
asks glibc to trim its heaps (``malloc_trim(0)``), in a worker thread (ctypes releases
the GIL for the call), at most one at a time and coalescing requests that end together.
Where there is no ``malloc_trim`` (macOS, whose allocator returns freed pages by
itself; musl) nothing is done.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
from collections.abc import Callable

log = logging.getLogger("slm_server.router")

THRESHOLD_BYTES = 16 * 1024 * 1024


def _glibc_trim() -> Callable[[], None] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int

    def run() -> None:
        trim(0)

    return run


class MemoryReturn:
    """Trims the allocator's heaps after large bodies are let go (see the module)."""

    def __init__(
        self,
        trim: Callable[[], None] | None = None,
        threshold_bytes: int = THRESHOLD_BYTES,
    ) -> None:
        self.trim = trim if trim is not None else _glibc_trim()
        self.threshold = threshold_bytes
        self.running = False
        self.again = False
        self.trims = 0  # how many trims ran (for tests)

    def released(self, size: int) -> None:
        """A request that held ``size`` bytes of the body budget ended."""
        if self.trim is None or size < self.threshold:
            return
        if self.running:
            self.again = True
            return
        self.running = True
        asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        assert self.trim is not None
        try:
            while True:
                self.again = False
                await asyncio.to_thread(self.trim)
                self.trims += 1
                if not self.again:
                    return
        except Exception:  # never a request's problem
            log.exception("malloc_trim failed")
        finally:
            self.running = False


__all__ = ["THRESHOLD_BYTES", "MemoryReturn"]
