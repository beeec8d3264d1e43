"""How much memory the machine has free right now, in MiB: what the memory floor
(``SLM_MEMORY_FLOOR_MB``) is compared with.

Every source answers :meth:`MemorySource.available_mb`, ``None`` when it cannot tell
(the caller then keeps what it knew). :func:`machine_source` picks one:

- Linux, :class:`MemInfoSource`: ``MemAvailable`` of ``/proc/meminfo``, the kernel's
  own estimate of what can be handed out without swapping (free pages, plus the page
  cache and reclaimable slab it would drop); the same number psutil calls
  ``available``, read without psutil so that the parsing is ours to test.
- macOS, :class:`VmStatSource`: free + speculative + inactive pages of ``vm_stat``
  times its page size; psutil's ``available`` on macOS is this very sum (inactive plus
  the kernel's free count, which includes the speculative pages that ``vm_stat`` lists
  apart). Not the kernel's pressure level (``kern.memorystatus_vm_pressure_level``):
  it is one of three levels, not an amount, so a floor in MiB cannot be compared with
  it, and it turns "warn" only once the compressor is already busy. Inactive pages may
  need compressing before they are reused, so this can overstate what is free by a
  little; the floor is there to keep a margin. ``vm_stat`` is a process started per
  reading (a few milliseconds, once per ``SLM_MEMORY_POLL_SECONDS``): its output is
  the platform's documented face, and parsing it is testable anywhere.
- elsewhere, :class:`PsutilSource`.
- :class:`SimulatedSource`: a file holding a number, for tests and diagnosis only
  (``SLM_MEMORY_SIMULATED_FILE``); the file must say so on its line
  (``simulated_available_mb 800``), so that no stray file can stand in for the machine.
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from pathlib import Path
from typing import Final, Protocol

import psutil

log = logging.getLogger("slm_server.memory")

MIB: Final = 1 << 20
MEMINFO: Final = Path("/proc/meminfo")
VM_STAT: Final = "/usr/bin/vm_stat"
VM_STAT_TIMEOUT_SECONDS: Final = 2.0
SIMULATED_MARK: Final = "simulated_available_mb"

_MEM_AVAILABLE = re.compile(r"^MemAvailable:\s+(\d+)\s+kB\s*$", re.MULTILINE)
_PAGE_SIZE = re.compile(r"^Mach Virtual Memory Statistics: \(page size of (\d+) bytes\)")
_PAGES = re.compile(r'^"?([A-Za-z][A-Za-z -]*)"?:\s+(\d+)\.\s*$', re.MULTILINE)
# The vm_stat lines whose pages can be handed out without paging anything out.
VM_STAT_AVAILABLE: Final = ("Pages free", "Pages speculative", "Pages inactive")
_SIMULATED = re.compile(rf"^\s*{SIMULATED_MARK}\s+(\d+)\s*$")


class MemorySource(Protocol):
    """The machine's free memory."""

    name: str

    def available_mb(self) -> int | None:
        """Free memory now, in MiB; ``None`` when it cannot be read."""
        ...


def mem_available_mb(text: str) -> int | None:
    """``MemAvailable`` of a ``/proc/meminfo`` text, in MiB (rounded down); ``None``
    when the line is missing (kernels before 3.14)."""
    match = _MEM_AVAILABLE.search(text)
    return None if match is None else int(match.group(1)) // 1024


def vm_stat_available_mb(text: str) -> int | None:
    """Free + speculative + inactive pages of a ``vm_stat`` output, in MiB (rounded
    down); ``None`` when it is not ``vm_stat``'s output (no page size, or a line of
    the three missing)."""
    header = _PAGE_SIZE.match(text.lstrip())
    if header is None:
        return None
    counts = {name.strip(): int(pages) for name, pages in _PAGES.findall(text)}
    if any(name not in counts for name in VM_STAT_AVAILABLE):
        return None
    pages = sum(counts[name] for name in VM_STAT_AVAILABLE)
    return pages * int(header.group(1)) // MIB


def simulated_mb(text: str) -> int | None:
    """The MiB a simulated-memory file holds (``simulated_available_mb <N>``), or
    ``None`` when its text is anything else."""
    match = _SIMULATED.match(text)
    return None if match is None else int(match.group(1))


class MemInfoSource:
    """Linux: ``MemAvailable`` of ``/proc/meminfo``."""

    name = "meminfo"

    def __init__(self, path: Path = MEMINFO) -> None:
        self.path = path

    def available_mb(self) -> int | None:
        try:
            text = self.path.read_text(encoding="ascii", errors="replace")
        except OSError as exc:
            log.warning("cannot read %s: %s", self.path, exc)
            return None
        return mem_available_mb(text)


class VmStatSource:
    """macOS: free + speculative + inactive pages of ``vm_stat``."""

    name = "vm_stat"

    def __init__(self, program: str = VM_STAT) -> None:
        self.program = program

    def available_mb(self) -> int | None:
        try:
            done = subprocess.run(  # noqa: S603 - a fixed program, no arguments
                [self.program],
                capture_output=True,
                text=True,
                timeout=VM_STAT_TIMEOUT_SECONDS,
                check=False,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("cannot run %s: %s", self.program, exc)
            return None
        return vm_stat_available_mb(done.stdout) if done.returncode == 0 else None


class PsutilSource:
    """Any other platform: psutil's ``available``."""

    name = "psutil"

    def available_mb(self) -> int | None:
        return int(psutil.virtual_memory().available) // MIB


class SimulatedSource:
    """For tests and diagnosis: the machine's free memory as a file says
    (``simulated_available_mb <N>``), read at every reading. A file that cannot be
    read or says anything else is no reading (``None``)."""

    name = "simulated"

    def __init__(self, path: Path) -> None:
        self.path = path

    def available_mb(self) -> int | None:
        try:
            return simulated_mb(self.path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            return None


def platform_source(platform: str = sys.platform) -> MemorySource:
    """The source for this operating system."""
    if platform.startswith("linux"):
        return MemInfoSource()
    if platform == "darwin":
        return VmStatSource()
    return PsutilSource()


def machine_source(simulated: Path | None) -> MemorySource:
    """The simulated source when ``simulated`` names its file, else the platform's."""
    return SimulatedSource(simulated) if simulated is not None else platform_source()


__all__ = [
    "MemInfoSource",
    "MemorySource",
    "PsutilSource",
    "SimulatedSource",
    "VmStatSource",
    "machine_source",
    "mem_available_mb",
    "platform_source",
    "simulated_mb",
    "vm_stat_available_mb",
]
