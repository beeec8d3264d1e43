"""Dependencies run one way. The router (``slm_server.router``) and the supervisor
(``slm_server.supervise``) share ``slm_server.contracts``, the registry's schema and the
shared utilities (settings, errors, http1, ...), never each other's modules;
``contracts`` imports neither; the router imports nothing from ``launch/``; no module
imports itself back through others, and neither does any package or part of the
package. The router's folders stack in the order a request travels (:data:`ROUTER_STACK`):
each imports only the folders below it."""

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


def crossings(sources: tuple[str, ...], targets: tuple[str, ...]) -> list[tuple[str, str]]:
    """Every import of a module under ``targets`` by a module under ``sources``."""
    return sorted(
        (a, b)
        for a, imported in imports().items()
        if a.startswith(sources)
        for b in imported
        if b.startswith(targets)
    )


def test_the_router_imports_nothing_from_the_supervisor_or_the_launcher() -> None:
    assert crossings(("slm_server.router",), ("slm_server.supervise", "slm_server.launch")) == []


def test_the_supervisor_and_the_launcher_import_nothing_from_the_router() -> None:
    assert crossings(("slm_server.supervise", "slm_server.launch"), ("slm_server.router",)) == []


def test_the_contracts_belong_to_neither_process() -> None:
    sides = (
        "slm_server.router",
        "slm_server.supervise",
        "slm_server.launch",
        "slm_server.cli.commands",
    )
    assert crossings(("slm_server.contracts",), sides) == []


def part_of(module: str) -> str:
    """The package part a module belongs to: ``slm_server.router.edge.hosts`` is in
    ``router``, ``slm_server.registry.schema`` is ``config``."""
    return module.split(".")[1] if "." in module else module


def test_the_parts_of_the_package_form_no_cycle() -> None:
    parts: dict[str, set[str]] = defaultdict(set)
    for a, imported in imports().items():
        for b in imported:
            if part_of(a) != part_of(b):
                parts[part_of(a)].add(part_of(b))
    assert find_cycles(dict(parts)) == []


def test_there_are_no_import_cycles() -> None:
    assert find_cycles(imports()) == []


def package_of(module: str, graph: dict[str, set[str]]) -> str:
    """The package a module is in (a package's ``__init__`` is in the package itself);
    the shared modules at the top (``slm_server.settings``, ...) each stand alone."""
    prefix = module + "."
    if any(other.startswith(prefix) for other in graph):
        return module
    package = module.rpartition(".")[0]
    return module if package == "slm_server" else package


def test_no_package_imports_itself_back_through_another() -> None:
    graph = imports()
    packages: dict[str, set[str]] = defaultdict(set)
    for a, imported in graph.items():
        if a == "slm_server.__main__":  # the entry point, above every package
            continue
        for b in imported:
            pa, pb = package_of(a, graph), package_of(b, graph)
            if pa != pb:
                packages[pa].add(pb)
    assert find_cycles(dict(packages)) == []


# The router's sub-folders from the top (the door) to the ground: what one admitted
# call carries through every layer. ``app.py`` and ``proxy.py`` (the one orchestrator)
# sit above them all.
ROUTER_STACK = (
    "edge",
    "dashboard",
    "observe",
    "apis",
    "reload",
    "ondemand",
    "intake",
    "dispatch",
    "answer",
    "toolcalls",
    "upstream",
    "watchdog",
    "call",
)


def router_folder(module: str) -> str | None:
    """The router sub-folder a module is in (``slm_server.router.edge.hosts``:
    ``edge``); None outside them (the router's own top modules, the rest)."""
    parts = module.split(".")
    if parts[:2] != ["slm_server", "router"] or len(parts) < 4:
        return None
    return parts[2]


def test_the_stack_names_every_router_folder() -> None:
    folders = {p.name for p in (PACKAGE / "router").iterdir() if (p / "__init__.py").exists()}
    assert folders == set(ROUTER_STACK)


def test_the_router_folders_import_only_what_sits_below_them() -> None:
    upward = []
    for a, imported in imports().items():
        folder = router_folder(a)
        if folder is None:
            continue
        level = ROUTER_STACK.index(folder)
        for b in imported:
            if b.startswith("slm_server.router") and b != "slm_server.router":
                target = router_folder(b)
                if target is None or ROUTER_STACK.index(target) < level:
                    upward.append((a, b))
    assert upward == []


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
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
    return cycles


def test_the_graph_is_read() -> None:
    """The checks above would pass on an empty graph: make sure they have one."""
    graph = imports()
    assert "slm_server.router.proxy" in graph
    assert router_folder("slm_server.router.call.exchange") == "call"
    assert router_folder("slm_server.router.app") is None
    assert "slm_server.contracts.records" in graph["slm_server.router.call.backend_state"]
    assert find_cycles({"a": {"b"}, "b": {"a"}}) == [["a", "b", "a"]]
    assert crossings(("slm_server.router",), ("slm_server.contracts",)) != []
