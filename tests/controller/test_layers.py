"""The controller's layers, read from each module's import statements (nothing is imported): `core` imports neither
runner, `local` and `k8s` import core but not each other, and no subpackage reaches up to the wiring (`__main__`,
`config`). No core module imports grpc: the client's typed errors are the boundary (services/client/errors.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = "services.controller"
ROOT = Path(__file__).resolve().parents[2] / "services" / "controller"
LAYERS = ("core", "local", "k8s")
# What each subpackage may not import. The top level (__main__, config) is above all three.
FORBIDDEN = {
    "core": {"local", "k8s", "__main__", "config"},
    "local": {"k8s", "__main__", "config"},
    "k8s": {"local", "__main__", "config"},
}
# Core modules that talk to the ledger's gRPC errors themselves: none since the client maps them to typed errors.
CORE_GRPC: set[str] = set()


def modules(layer: str) -> list[Path]:
    return sorted((ROOT / layer).glob("*.py"))


def imported(path: Path) -> set[str]:
    """The absolute names of the modules `path` imports, its relative imports resolved against its package."""
    package = f"{PACKAGE}.{path.parent.name}".split(".")
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            # `from . import sandbox` imports a module too: keep both the package and the names.
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def layer_of(name: str) -> str | None:
    """Which part of the controller a module name is in (a subpackage, `__main__`, `config`), None outside it."""
    if not name.startswith(PACKAGE + "."):
        return None
    return name.removeprefix(PACKAGE + ".").split(".")[0]


def test_every_layer_has_modules_and_nothing_is_left_beside_the_wiring() -> None:
    assert all(modules(layer) for layer in LAYERS)
    top = sorted(path.name for path in ROOT.glob("*.py"))
    assert top == ["__init__.py", "__main__.py", "config.py"]


@pytest.mark.parametrize("layer", LAYERS)
def test_imports_only_go_downwards(layer: str) -> None:
    wrong = {
        f"{path.name} imports {name}"
        for path in modules(layer)
        for name in imported(path)
        if layer_of(name) in FORBIDDEN[layer]
    }
    assert not wrong, sorted(wrong)


def test_the_layer_check_sees_relative_imports() -> None:
    # local_runner imports core relatively (`from ..core.runner import ...`): resolved, it must be seen as core.
    names = imported(ROOT / "local" / "local_runner.py")
    assert f"{PACKAGE}.core.runner" in names
    assert {layer_of(name) for name in names} >= {"core", "local"}


def test_only_the_core_modules_that_did_import_grpc() -> None:
    with_grpc = {path.stem for path in modules("core") if any(n.split(".")[0] == "grpc" for n in imported(path))}
    assert with_grpc <= CORE_GRPC, sorted(with_grpc - CORE_GRPC)
