"""Makes `agentlightning.verl.trainer` importable without verl, torch and tensordict (GBs the suite does not run).

The trainer's gateway calls (`_pause_and_drain_gateway`, `_resume_gateway`) are plain HTTP through v1.0's own
client; only the module's imports need the training stack. Every module under those three names is an empty
stand-in whose attributes are inert placeholders, so the import succeeds and nothing of them is ever called.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

_ROOTS = ("verl", "torch", "tensordict")


class _Inert:
    """A class, a decorator or a value, whatever the importing module takes it for."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return args[0] if len(args) == 1 and callable(args[0]) and not kwargs else _Inert()

    def __getattr__(self, name: str) -> Any:
        return _Inert()


class _Placeholder(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (_Inert,), {})


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".")[0] in _ROOTS:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _Placeholder(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def install() -> None:
    for name in _ROOTS:
        if name in sys.modules:
            raise RuntimeError(f"{name} is already imported: the placeholders must come first")
    sys.meta_path.insert(0, _Finder())
