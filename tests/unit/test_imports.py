"""Dependencies run one way: the router and the supervisor share contracts (config,
records, errors, settings, http1, supervise's judging of traffic), never each other's
internals; the router imports nothing from ``launch/``; no module imports itself back
through others."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "slm_server"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports() -> dict[str, set[str]]:
    """Every ``slm_server`` module and the ``slm_server`` modules it imports (at any
    level of the file, function bodies included)."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if not node.module.startswith("slm_server"):
                    continue
                for alias in node.names:
                    candidate = f"{node.module}.{alias.name}"
                    graph[name].add(candidate if candidate in modules else node.module)
            elif isinstance(node, ast.Import):
                graph[name].update(a.name for a in node.names if a.name.startswith("slm_server"))
        graph.setdefault(name, set())
    return dict(graph)


def test_the_router_imports_nothing_from_launch() -> None:
    wrong = sorted(
        (a, b)
        for a, targets in imports().items()
        if a.startswith("slm_server.router")
        for b in targets
        if b.startswith("slm_server.launch")
    )
    assert wrong == []


def test_the_supervisor_and_the_launcher_import_nothing_from_the_router() -> None:
    wrong = sorted(
        (a, b)
        for a, targets in imports().items()
        if a.startswith(("slm_server.supervise", "slm_server.launch"))
        for b in targets
        if b.startswith("slm_server.router")
    )
    assert wrong == []


def test_there_are_no_import_cycles() -> None:
    graph = imports()
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if target not in graph:
                continue
            if state.get(target) == 1:
                cycles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert cycles == []


def test_the_graph_is_read() -> None:
    """The checks above would pass on an empty graph: make sure they have one."""
    graph = imports()
    assert "slm_server.router.proxy" in graph
    assert "slm_server.records" in graph["slm_server.router.backend_state"]
