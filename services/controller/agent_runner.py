"""Runs an agent class: `python -m services.controller.agent_runner module:Class`.

Imports the module, instantiates the class without arguments and calls its run(); a coroutine result is
awaited. Exit code 0 when run() returns, 1 when it raises (traceback on stderr), 2 when the class cannot be
loaded. The agent reads the §3 variables from its environment itself.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import sys
import traceback
from typing import Any

LOAD_FAILED = 2


def load_class(spec: str) -> Any:
    """ "module:Class" or "module.Class" (the part after ":" may be dotted) -> the object it names."""
    if ":" in spec:
        module_name, _, attr_path = spec.partition(":")
    else:
        module_name, _, attr_path = spec.rpartition(".")
    target: Any = importlib.import_module(module_name)
    for part in attr_path.split("."):
        target = getattr(target, part)
    return target


def run_agent(spec: str) -> int:
    try:
        agent = load_class(spec)()
    except Exception:
        traceback.print_exc()
        sys.stderr.write(f"agent_runner: cannot load agent class {spec!r}\n")
        return LOAD_FAILED
    try:
        result = agent.run()
        if inspect.isawaitable(result):
            asyncio.run(_wait(result))
    except Exception:
        traceback.print_exc()
        return 1
    return 0


async def _wait(awaitable: Any) -> Any:
    return await awaitable


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.stderr.write("usage: python -m services.controller.agent_runner module:Class\n")
        return LOAD_FAILED
    return run_agent(args[0])


if __name__ == "__main__":
    sys.exit(main())
