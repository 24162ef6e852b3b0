"""No circle in the import graph of services/: a module never imports, directly or through others, a module that
imports it (imports inside functions and under TYPE_CHECKING count: a circle hidden in a function is still two
modules that cannot be understood one without the other). Read from the import statements; nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GENERATED = "_gen"


def module_files() -> dict[str, tuple[Path, bool]]:
    """Each module's dotted name -> (its file, whether it is a package's __init__)."""
    found = {}
    for path in (ROOT / "services").rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if GENERATED in parts:
            continue
        package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if package else parts)] = (path, package)
    return found


def imports_of(name: str, path: Path, package: bool, known: dict[str, tuple[Path, bool]]) -> set[str]:
    """The modules of services/ that `name` imports (`from pkg import mod` is mod; `from pkg import name` is pkg)."""
    here = name.split(".") if package else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.update(f"{module}.{a.name}" if f"{module}.{a.name}" in known else module for a in node.names)
    return {module for module in found if module in known and module != name}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_no_module_of_services_imports_one_that_imports_it() -> None:
    known = module_files()
    graph = {name: imports_of(name, *known[name], known) for name in known}
    assert len(graph) > 150 and sum(map(len, graph.values())) > 300  # the walk saw the tree and its imports
    assert circles(graph) == []


def test_the_check_finds_a_circle_through_a_third_module_and_a_lazy_import() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def folder_of(module: str, depth: int) -> str:
    """The unit a module belongs to in its service's layout: its folder below the service (services.proxy.call), or
    itself for a module at the service's top level (services.proxy.runtime)."""
    parts = module.split(".")
    return ".".join(parts[: depth + 1]) if len(parts) > depth + 1 else module


def test_the_folders_of_the_proxy_and_the_trainer_import_each_other_one_way() -> None:
    known = module_files()
    graph = {name: imports_of(name, *known[name], known) for name in known}
    for service in ("services.proxy", "services.trainer"):
        depth = service.count(".") + 1
        units: dict[str, set[str]] = {}
        for name, imported in graph.items():
            if name.startswith(service + "."):
                unit = folder_of(name, depth)
                edges = {folder_of(m, depth) for m in imported if m.startswith(service + ".")}
                units.setdefault(unit, set()).update(edges - {unit})
        folders = [
            unit for unit in units if unit.count(".") == depth and unit.rsplit(".", 1)[-1] in known_folders(service)
        ]
        assert len(folders) >= 4, folders  # the layout is there
        assert circles(units) == [], service


def known_folders(service: str) -> set[str]:
    root = ROOT.joinpath(*service.split("."))
    return {p.name for p in root.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}


def test_only_the_proxy_app_imports_agent_lightning_v1s_surface() -> None:
    known = module_files()
    for name in known:
        if name.startswith("services.proxy.") and not name.startswith(("services.proxy.v1", "services.proxy.app")):
            imported = imports_of(name, *known[name], known)
            assert not [m for m in imported if m.startswith("services.proxy.v1")], name
