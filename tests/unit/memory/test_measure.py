"""The resident set of a real process tree: this test process, and a child whose own
child holds 50 MB."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import psutil
import pytest

from slm_server.memory.measure import MIB, resident_bytes, resident_mb

GRANDCHILD = textwrap.dedent(
    """
    import sys
    held = b"x" * (50 << 20)  # written, so resident
    print("ready", flush=True)
    sys.stdin.read()
    """
)
CHILD = textwrap.dedent(
    f"""
    import subprocess, sys
    sys.exit(subprocess.call([sys.executable, "-c", {GRANDCHILD!r}]))
    """
)


@pytest.fixture
def tree() -> Iterator[subprocess.Popen[str]]:
    """A child waiting on its own child, which holds 50 MB until stdin closes."""
    with subprocess.Popen(
        [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as child:
        assert child.stdout is not None and child.stdin is not None
        root = psutil.Process(child.pid)
        try:
            assert child.stdout.readline() == "ready\n"
            yield child
        finally:
            descendants = root.children(recursive=True)
            child.stdin.close()  # the grandchild reads EOF, exits, and so does the child
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                for process in [*descendants, root]:
                    with contextlib.suppress(psutil.NoSuchProcess):
                        process.kill()
            _, alive = psutil.wait_procs(descendants, timeout=10)
            assert not alive


def test_the_tree_counts_its_descendants(tree: subprocess.Popen[str]) -> None:
    alone = psutil.Process(tree.pid).memory_info().rss
    total = resident_bytes(tree.pid)
    assert total is not None
    assert total - alone >= 40 * MIB
    in_mb = resident_mb(tree.pid)
    assert in_mb is not None
    assert in_mb >= 40 + alone // MIB


def test_this_process_is_measured() -> None:
    own = resident_mb(psutil.Process().pid)
    assert own is not None
    assert 10 <= own <= psutil.virtual_memory().total // MIB


def test_a_process_that_is_gone_measures_none() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert resident_mb(child.pid) is None


def test_a_descendant_that_vanishes_mid_walk_is_skipped(
    tree: subprocess.Popen[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = psutil.Process.memory_info

    def vanishing(process: psutil.Process) -> object:
        if process.pid != tree.pid:
            raise psutil.NoSuchProcess(process.pid)
        return real(process)

    monkeypatch.setattr(psutil.Process, "memory_info", vanishing)
    assert resident_bytes(tree.pid) == real(psutil.Process(tree.pid)).rss
