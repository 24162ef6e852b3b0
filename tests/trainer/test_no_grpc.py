"""The trainer talks to the ledger only through the client's typed API: no trainer module imports grpc (read from
each module's import statements; nothing is imported)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "services" / "trainer"


def imports_grpc(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "grpc" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "grpc":
            return True
    return False


def test_no_trainer_module_imports_grpc() -> None:
    modules = sorted(ROOT.rglob("*.py"))
    assert len(modules) > 20  # the walk found the package
    assert not [str(p.relative_to(ROOT)) for p in modules if imports_grpc(p)]


def test_the_check_sees_an_import_inside_a_function(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    import grpc.aio\n")
    assert imports_grpc(module)
    module.write_text("from grpc import aio\n")
    assert imports_grpc(module)
    module.write_text("from .grpc import x\n")
    assert not imports_grpc(module)
