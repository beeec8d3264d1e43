""":func:`~slm_server.supervise.core.decide.decide` is the only writer of a backend's
lifecycle: no other module of ``slm_server/supervise/`` assigns a phase, or any field of
a :class:`~slm_server.supervise.core.decide.Lifecycle`, or spends its restart budget. The
shell observes, calls ``decide`` and carries out the actions; a chore that needs a
lifecycle to change asks for it with an observation. The shell builds each lifecycle
from the registry, but without a phase: :class:`~slm_server.supervise.core.decide.Begin`
chooses the first one.

Read from the source (its syntax tree), so that a new module is covered as soon as it
exists; the scanner itself is checked on snippets that write and that only read.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from slm_server import supervise
from slm_server.supervise.core import decide
from slm_server.supervise.core.decide import Lifecycle

PACKAGE = Path(supervise.__file__).parent
DECIDE = Path(decide.__file__)
WRITER = DECIDE.name
FIELDS = frozenset(f.name for f in dataclasses.fields(Lifecycle))
LIFE_NAMES = frozenset({"life", "lifecycle"})
BUDGET_WRITES = frozenset({"spend"})


def _is_life(node: ast.expr) -> bool:
    """``life``, ``lifecycle`` or ``<anything>.life``: an expression naming a lifecycle."""
    if isinstance(node, ast.Name):
        return node.id in LIFE_NAMES
    return isinstance(node, ast.Attribute) and node.attr == "life"


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        found = list(node.targets)
    elif isinstance(node, ast.AugAssign | ast.AnnAssign):
        found = [node.target]
    elif isinstance(node, ast.Delete):
        found = list(node.targets)
    else:
        return []
    flat: list[ast.expr] = []
    while found:
        target = found.pop()
        if isinstance(target, ast.Tuple | ast.List):
            found.extend(target.elts)
        elif isinstance(target, ast.Starred):
            found.append(target.value)
        else:
            flat.append(target)
    return flat


def writes(source: str) -> list[str]:
    """Each write of a lifecycle in ``source``, as ``line: text``."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        for target in _targets(node):
            while isinstance(target, ast.Subscript):  # life.restarts_by_reason[k] = ...
                target = target.value
            if not isinstance(target, ast.Attribute):
                continue
            if target.attr == "phase" or (target.attr in FIELDS and _is_life(target.value)):
                found.append(f"{getattr(node, 'lineno', 0)}: {ast.unparse(node)}")
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        if called == "Lifecycle" and any(k.arg == "phase" for k in node.keywords):
            found.append(f"{node.lineno}: {ast.unparse(node)}")  # the first phase: Begin's
        elif isinstance(func, ast.Name) and func.id == "setattr" and node.args:
            named = node.args[1] if len(node.args) > 1 else None
            field = named.value if isinstance(named, ast.Constant) else None
            if _is_life(node.args[0]) or field == "phase":
                found.append(f"{node.lineno}: {ast.unparse(node)}")
        elif (
            isinstance(func, ast.Attribute)
            and func.attr in BUDGET_WRITES
            and isinstance(func.value, ast.Attribute)
            and func.value.attr == "budget"
        ):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


SHELL = sorted(p for p in PACKAGE.rglob("*.py") if p != DECIDE)


@pytest.mark.parametrize("path", SHELL, ids=[str(p.relative_to(PACKAGE)) for p in SHELL])
def test_no_module_but_decide_writes_a_lifecycle(path: Path) -> None:
    found = writes(path.read_text(encoding="utf-8"))
    assert found == [], f"{path.name} writes a lifecycle outside decide(): {found}"


def test_the_shell_is_scanned() -> None:
    names = {p.name for p in SHELL}
    shell = {"supervisor.py", "backend.py", "publish.py", "footprints.py", "housekeeping.py"}
    assert shell | {"command_socket.py", "control.py"} <= names
    assert WRITER not in names


def test_decide_is_the_writer() -> None:
    """The scanner sees decide's own writes: it would see them anywhere else."""
    assert len(writes(DECIDE.read_text(encoding="utf-8"))) > 10


@pytest.mark.parametrize(
    "snippet",
    [
        "backend.life.phase = Done(State.STOPPED)",
        "life.phase = Ready()",
        "self.backends[role].life.since = self.wall()",
        "backend.life.alive, x = False, 1",
        "life.restarts_by_reason['exited'] = 1",
        "life.restarts += 1",
        "backend.life.measured_mb = resident",
        "something.phase = Unloaded()",
        "setattr(backend.life, 'phase', Ready())",
        "setattr(anything, 'phase', Ready())",
        "backend.life.budget.spend(now)",
        "del life.reason",
        "life = core.Lifecycle(role='a', model_id='m', port=1, budget=b, phase=Unloaded())",
    ],
)
def test_the_scanner_finds_a_write(snippet: str) -> None:
    assert writes(snippet) != []


@pytest.mark.parametrize(
    "snippet",
    [
        "state = backend.life.state",
        "if life.phase == Ready(): pass",
        "life = core.Lifecycle(role='a', model_id='m', port=1, budget=b, on_demand=True)",
        "remote.since = now",  # not a lifecycle
        "backend.plan = plan",
        "backend.life.budget.exhausted(now)",
    ],
)
def test_the_scanner_lets_reads_and_other_objects_be(snippet: str) -> None:
    assert writes(snippet) == []
