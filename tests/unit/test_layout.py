"""The house keeps its shape: no folder of the package holds more than 16 modules, at
most six sit at its top, no function runs over 80 lines unless a comment right above it
says why it must be one piece (``# one piece: ...``), each API shape's path is written
once in the package (in the table of shapes, or the engines' paths it names), and the
orchestrator compares no path."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

from slm_server.router.apis.table import TABLE

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "slm_server"
MAX_MODULES = 16
MAX_TOP = 6
MAX_LINES = 80
REASON = "# one piece:"


def test_no_folder_holds_more_than_16_modules() -> None:
    crowded = {
        str(folder.relative_to(ROOT)): count
        for folder in [PACKAGE, *(p for p in PACKAGE.rglob("*") if p.is_dir())]
        if (count := len(list(folder.glob("*.py")))) > MAX_MODULES
    }
    assert crowded == {}


def test_at_most_six_modules_sit_at_the_top() -> None:
    assert len(list(PACKAGE.glob("*.py"))) <= MAX_TOP


def long_functions(source: str) -> list[tuple[str, int]]:
    """The functions of ``source`` over 80 lines with no reason written above them."""
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            above = lines[first - 2].strip() if first >= 2 else ""
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > MAX_LINES and not above.startswith(REASON):
                found.append((node.name, node.lineno))
    return found


def test_no_function_runs_over_80_lines_without_a_reason() -> None:
    long = {
        str(path.relative_to(ROOT)): found
        for path in PACKAGE.rglob("*.py")
        if (found := long_functions(path.read_text(encoding="utf-8")))
    }
    assert long == {}


def test_the_length_check_sees_a_long_function_and_its_reason() -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_LINES))
    assert long_functions(f"def f() -> None:\n{body}") == [("f", 1)]
    assert long_functions(f"{REASON} a table\ndef f() -> None:\n{body}") == []


def string_literals(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


def test_each_shape_path_is_written_once_in_the_package() -> None:
    """In the table, or, for the paths every model server serves too (which the
    supervisor's canary asks), in the contract the table names them by."""
    written = Counter(
        (literal, str(path.relative_to(ROOT)))
        for path in PACKAGE.rglob("*.py")
        for literal in string_literals(path)
    )
    homes = ("slm_server/router/apis/table.py", "slm_server/contracts/engine_paths.py")
    for row in TABLE:
        places = {where: n for (literal, where), n in written.items() if literal == row.shape.path}
        assert len(places) == 1, (row.shape.path, places)
        [(where, count)] = places.items()
        assert where in homes and count == 1, row.shape.path


def test_the_orchestrator_compares_no_path() -> None:
    tree = ast.parse((PACKAGE / "router" / "proxy.py").read_text(encoding="utf-8"))
    compared = [
        ast.unparse(node)
        for node in ast.walk(tree)
        if isinstance(node, ast.Compare)
        and any(
            isinstance(side, ast.Constant) and isinstance(side.value, str)
            for side in (node.left, *node.comparators)
        )
    ]
    assert compared == []
