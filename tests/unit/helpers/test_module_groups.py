"""Every test module that starts a stack once for all its tests (a module-scoped
fixture, or the shared fakes and router of ``tests/integration/conftest.py``) runs on
one worker: it carries ``pytest.mark.xdist_group`` (or runs alone, ``serial``). Without
the mark, ``--dist loadgroup`` hands its tests out one by one and each worker that gets
one starts the stack again (the suite's CPU, on two CPUs, is its run time)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.processes import ROOT

SHARES_A_STACK = re.compile(
    r'scope="(module|session|package)"|\bFAKE_ROLES\b|def router_process\b|\bstart_router\b'
)
RUNS_ON_ONE_WORKER = re.compile(r"xdist_group\(|pytest\.mark\.serial\b")


def test_every_module_sharing_a_stack_runs_on_one_worker() -> None:
    modules = sorted((ROOT / "tests").rglob("test_*.py"))
    assert len(modules) > 100
    ungrouped = [
        str(path.relative_to(ROOT))
        for path in modules
        if path != Path(__file__)
        and SHARES_A_STACK.search(text := path.read_text())
        and not RUNS_ON_ONE_WORKER.search(text)
    ]
    assert ungrouped == []
