"""The parallel suite relies on pytest-xdist's ``--dist loadgroup`` keeping the tests of
one ``xdist_group`` on one worker, so a module's expensive module-scoped stack starts
once (scripts/test.sh). It silently stopped grouping with pytest 9.2
(pytest-dev/pytest-xdist#1386); this fails if the installed pair ever does that again."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

GROUPED = """
import os

import pytest

pytestmark = pytest.mark.xdist_group("stack")


@pytest.fixture(scope="module")
def stack():
    with open("setups.txt", "a") as setups:
        setups.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")
    return 1


@pytest.mark.parametrize("i", range(6))
def test_grouped(stack, i):
    assert stack == 1
"""

LOOSE = """
import pytest


@pytest.mark.parametrize("i", range(12))
def test_loose(i):
    assert i >= 0
"""


QUIET = ["-p", "no:cacheprovider", "-c", "pytest.ini", "--rootdir", "."]


def test_one_group_runs_on_one_worker_with_one_setup(tmp_path: Path) -> None:
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    (tmp_path / "test_loose.py").write_text(LOOSE)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "3", "--dist", "loadgroup", "-q", *QUIET],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    setups = (tmp_path / "setups.txt").read_text().split()
    assert len(setups) == 1, f"the group's module fixture was set up on workers {setups}"
