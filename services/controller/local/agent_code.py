"""Which loaded modules are the agent's own code (watched for changes) and which are installed libraries.

A module is a library when its file lies under the interpreter's prefixes or a site-packages folder, or when
it has no file (built in). Everything else (the agent, the repository's packages) is local code: the warm
launcher reports its files' modification times, and the controller replaces a launcher whose code changed.
"""

from __future__ import annotations

import contextlib
import os
import site
import sys
from collections.abc import Iterable
from functools import lru_cache


@lru_cache(maxsize=1)
def _library_roots() -> tuple[str, ...]:
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    with contextlib.suppress(AttributeError):  # old virtualenvs lack it
        roots.update(site.getsitepackages())
    roots.add(site.getusersitepackages())
    return tuple(os.path.join(os.path.realpath(root), "") for root in roots if root)


def _module_file(module: object) -> str | None:
    path = getattr(module, "__file__", None)
    return os.path.realpath(path) if isinstance(path, str) else None


def is_library_file(path: str | None) -> bool:
    return path is None or path.startswith(_library_roots())


def local_files() -> dict[str, int]:
    """Files of the loaded modules that are local code, with their modification times (ns)."""
    files: dict[str, int] = {}
    for module in list(sys.modules.values()):
        path = _module_file(module)
        if path is None or is_library_file(path):
            continue
        try:
            files[path] = os.stat(path).st_mtime_ns
        except OSError:
            continue
    return files


def learned_modules(before: Iterable[str]) -> list[str]:
    """Library modules loaded since `before` (names), so the launcher can import them once for later agents."""
    seen = set(before)
    names = []
    for name, module in list(sys.modules.items()):
        if name in seen or name == "__main__" or module is None:
            continue
        if is_library_file(_module_file(module)):
            names.append(name)
    return sorted(names)


def changed(files: dict[str, int]) -> str | None:
    """The first watched file that changed or vanished since its time was taken, else None."""
    for path, mtime in files.items():
        try:
            if os.stat(path).st_mtime_ns != mtime:
                return path
        except OSError:
            return path
    return None
