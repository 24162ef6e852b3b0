"""User hooks: a Python file with one hooks class.

    class MyHooks:
        def on_enqueue(self, spec):            # agl.v1.RolloutSpec; return a spec to replace it, or None
            ...
        async def on_succeeded(self, rollout, events):   # return extra agl.v1.Event objects, or None
            ...
        def on_failed(self, rollout, events):
            ...

Every method is optional and may be sync or async. `agl.hooks` names the file, optionally with the class
(`hooks.py:MyHooks`); without one the file must define exactly one class with at least one hook method.
"""

from __future__ import annotations

import importlib.util
import inspect
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from services._gen.agl.v1 import event_pb2, rollout_pb2

log = logging.getLogger(__name__)

HOOK_METHODS = ("on_enqueue", "on_succeeded", "on_failed")


class HooksError(ValueError):
    """The hooks file could not be loaded."""


def load_hooks(reference: str) -> Any:
    """Instantiates the hooks class named by "path/to/file.py[:ClassName]"."""
    path_text, _, class_name = reference.partition(":")
    path = Path(path_text)
    if not path.is_file():
        raise HooksError(f"hooks file {path} does not exist")
    spec = importlib.util.spec_from_file_location(f"agl_user_hooks_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise HooksError(f"cannot import hooks file {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if class_name:
        cls = getattr(module, class_name, None)
        if not inspect.isclass(cls):
            raise HooksError(f"hooks file {path} has no class {class_name}")
        return cls()
    candidates = [
        obj
        for obj in vars(module).values()
        if inspect.isclass(obj) and obj.__module__ == module.__name__ and any(hasattr(obj, m) for m in HOOK_METHODS)
    ]
    if len(candidates) != 1:
        names = [c.__name__ for c in candidates]
        raise HooksError(f"hooks file {path} must define exactly one hooks class, found {names}; name it as file:Class")
    return candidates[0]()


async def _call(hooks: Any, name: str, *args: Any) -> Any:
    method = getattr(hooks, name, None)
    if method is None:
        return None
    result = method(*args)
    if inspect.isawaitable(result):
        result = await result
    return result


async def on_enqueue(hooks: Any, spec: rollout_pb2.RolloutSpec) -> rollout_pb2.RolloutSpec:
    if hooks is None:
        return spec
    replaced = await _call(hooks, "on_enqueue", spec)
    if replaced is None:
        return spec
    if replaced.rollout_id != spec.rollout_id:
        raise HooksError(f"on_enqueue must keep the rollout id ({spec.rollout_id} -> {replaced.rollout_id})")
    return replaced


async def on_finished(
    hooks: Any, rollout: rollout_pb2.Rollout, events: Sequence[event_pb2.Event], succeeded: bool
) -> list[event_pb2.Event]:
    """Extra events from on_succeeded / on_failed, stamped with the rollout, its attempt and stable event ids."""
    if hooks is None:
        return []
    name = "on_succeeded" if succeeded else "on_failed"
    added = await _call(hooks, name, rollout, list(events)) or []
    out: list[event_pb2.Event] = []
    for i, event in enumerate(added):
        stamped = event_pb2.Event()
        stamped.CopyFrom(event)
        stamped.rollout_id = rollout.rollout_id
        stamped.attempt_id = stamped.attempt_id or rollout.status.attempt_id
        # Stable id: a manager that restarts and runs the hook again appends nothing twice.
        stamped.event_id = stamped.event_id or f"agl-hook-{name}-{i}"
        out.append(stamped)
    return out
