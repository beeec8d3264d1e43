"""The machine's free memory: the Linux source read for real on Linux; the macOS
source **simulated** — its parsing of ``vm_stat`` is tested on samples written in
``vm_stat``'s output format (no Mac was at hand to record them on), and the source
itself runs a stand-in program that prints them; the simulated file source."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import psutil
import pytest

from slm_server.memory.available import (
    MemInfoSource,
    PsutilSource,
    SimulatedSource,
    VmStatSource,
    machine_source,
    mem_available_mb,
    platform_source,
    simulated_mb,
    vm_stat_available_mb,
)

# The head of /proc/meminfo as recorded on the Linux 6.18 machine these tests were
# written on.
MEMINFO = """\
MemTotal:       24683784 kB
MemFree:        19487996 kB
MemAvailable:   24083132 kB
Buffers:          145080 kB
Cached:          4231012 kB
SwapCached:            0 kB
Active:          2842048 kB
Inactive:        1527980 kB
"""

# vm_stat on Apple Silicon (16 KiB pages), in the layout of macOS 14's vm_stat.
VM_STAT_ARM = """\
Mach Virtual Memory Statistics: (page size of 16384 bytes)
Pages free:                               45231.
Pages active:                            892341.
Pages inactive:                          234521.
Pages speculative:                        12345.
Pages throttled:                              0.
Pages wired down:                        456789.
Pages purgeable:                          23456.
"Translation faults":                1234567890.
Pages copy-on-write:                   12345678.
Pages zero filled:                    234567890.
Pages reactivated:                      1234567.
Pages purged:                            234567.
File-backed pages:                       345678.
Anonymous pages:                         567890.
Pages stored in compressor:              890123.
Pages occupied by compressor:            123456.
Decompressions:                          345678.
Compressions:                            567890.
Pageins:                                 123456.
Pageouts:                                     0.
Swapins:                                      0.
Swapouts:                                     0.
"""

# vm_stat on an Intel Mac (4 KiB pages), a machine short of memory.
VM_STAT_INTEL = """\
Mach Virtual Memory Statistics: (page size of 4096 bytes)
Pages free:                                6012.
Pages active:                           1503321.
Pages inactive:                           51200.
Pages speculative:                         1988.
Pages throttled:                              0.
Pages wired down:                        612345.
Pages purgeable:                            120.
"Translation faults":                 987654321.
Pages copy-on-write:                    7654321.
Pages zero filled:                    123456789.
Pages reactivated:                       765432.
Pages purged:                             54321.
File-backed pages:                        98765.
Anonymous pages:                        1456789.
Pages stored in compressor:             2345678.
Pages occupied by compressor:            612345.
Decompressions:                         3456789.
Compressions:                           4567890.
Pageins:                                 234567.
Pageouts:                                 12345.
Swapins:                                 345678.
Swapouts:                                456789.
"""


# -- Linux ------------------------------------------------------------------------------


def test_meminfo_is_parsed_to_mib() -> None:
    assert mem_available_mb(MEMINFO) == 24083132 // 1024


def test_meminfo_without_mem_available_is_no_reading() -> None:
    old_kernel = "\n".join(line for line in MEMINFO.splitlines() if "Available" not in line)
    assert mem_available_mb(old_kernel) is None
    assert mem_available_mb("") is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/meminfo")
def test_the_linux_source_reads_the_machine_and_agrees_with_psutil() -> None:
    """Real numbers: positive, below the machine's total, and what psutil says within
    the memory that may come and go between the two reads."""
    source = platform_source()
    assert isinstance(source, MemInfoSource)
    before = psutil.virtual_memory()
    free = source.available_mb()
    after = psutil.virtual_memory()
    assert free is not None
    assert 0 < free <= before.total >> 20
    low = min(before.available, after.available) >> 20
    high = max(before.available, after.available) >> 20
    assert low - 256 <= free <= high + 256, (low, free, high)
    text = Path("/proc/meminfo").read_text()
    assert abs(free - (mem_available_mb(text) or 0)) <= 256


def test_an_unreadable_meminfo_is_no_reading(tmp_path: Path) -> None:
    assert MemInfoSource(tmp_path / "absent").available_mb() is None


# -- macOS, simulated ---------------------------------------------------------------------


def test_vm_stat_on_apple_silicon_is_free_speculative_and_inactive_pages() -> None:
    pages = 45231 + 12345 + 234521
    assert vm_stat_available_mb(VM_STAT_ARM) == pages * 16384 // (1 << 20)


def test_vm_stat_on_intel_uses_its_page_size() -> None:
    pages = 6012 + 1988 + 51200
    assert vm_stat_available_mb(VM_STAT_INTEL) == pages * 4096 // (1 << 20) == 231


def test_vm_stat_sum_is_what_psutil_calls_available_on_macos() -> None:
    """psutil's ``available`` on macOS is inactive + the kernel's free count, which
    holds the speculative pages vm_stat lists apart (psutil/_psosx.py)."""
    free_count = 45231 + 12345
    psutil_available = (234521 + free_count) * 16384
    assert vm_stat_available_mb(VM_STAT_ARM) == psutil_available >> 20


@pytest.mark.parametrize(
    "text",
    [
        "",
        "vm_stat: command not found\n",
        VM_STAT_ARM.replace("Pages inactive", "Pages idle"),  # a line missing
        VM_STAT_ARM.split("\n", 1)[1],  # no page size
    ],
)
def test_anything_but_vm_stat_output_is_no_reading(text: str) -> None:
    assert vm_stat_available_mb(text) is None


def stand_in(tmp_path: Path, output: str, exit_code: int = 0) -> str:
    """A program that prints ``output`` as vm_stat would."""
    (tmp_path / "sample.txt").write_text(output)
    program = tmp_path / "vm_stat"
    program.write_text(f"#!/bin/sh\ncat '{tmp_path / 'sample.txt'}'\nexit {exit_code}\n")
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    return str(program)


def test_the_macos_source_runs_vm_stat_and_parses_it(tmp_path: Path) -> None:
    source = VmStatSource(stand_in(tmp_path, VM_STAT_INTEL))
    assert source.available_mb() == 231
    assert source.name == "vm_stat"


def test_the_macos_source_without_a_good_vm_stat_is_no_reading(tmp_path: Path) -> None:
    assert VmStatSource(str(tmp_path / "absent")).available_mb() is None
    assert VmStatSource(stand_in(tmp_path, VM_STAT_ARM, exit_code=1)).available_mb() is None


# -- choosing, and the simulated file ------------------------------------------------------


def test_each_platform_gets_its_source(tmp_path: Path) -> None:
    assert isinstance(platform_source("linux"), MemInfoSource)
    assert isinstance(platform_source("darwin"), VmStatSource)
    assert isinstance(platform_source("win32"), PsutilSource)
    assert isinstance(machine_source(None), type(platform_source()))
    simulated = machine_source(tmp_path / "free")
    assert isinstance(simulated, SimulatedSource) and simulated.name == "simulated"


def test_the_psutil_source_reads_the_machine() -> None:
    free = PsutilSource().available_mb()
    assert free is not None and 0 < free <= psutil.virtual_memory().total >> 20


def test_the_simulated_source_reads_its_file_at_every_reading(tmp_path: Path) -> None:
    path = tmp_path / "free"
    source = SimulatedSource(path)
    assert source.available_mb() is None  # no file yet
    path.write_text("simulated_available_mb 800\n")
    assert source.available_mb() == 800
    path.write_text("simulated_available_mb 4000")
    assert source.available_mb() == 4000
    for text in ("800", "available 800", "simulated_available_mb -1", "simulated_available_mb"):
        path.write_text(text)
        assert source.available_mb() is None, text
        assert simulated_mb(text) is None
