"""Runs an agent class: `python -m services.controller.core.agent_runner [--notify-fd N --launch-id ID]
[--result-file P | --result-fd N] module:Class`.

Imports the module, instantiates the class without arguments and calls its run(); a coroutine result is
awaited. Exit code 0 when run() returns, 1 when it raises (traceback on stderr), 2 when the class cannot be
loaded; sys.exit(n) in the agent exits with n. The agent reads the §3 variables from its environment itself.
Right before run() is called, one datagram "ID <monotonic time>" goes to --notify-fd (the controller's
launch-latency clock). When run() returns a number (an int or a float, not a bool; finite), `{"value": x}` is
written to --result-file (or to --result-fd, a file the controller opened for it: a contained local agent cannot
open the controller's log directory): the controller posts it as the reward unless the agent posted one (the older
Agent Lightning habit of returning the reward). In a Kubernetes Job, `--result-file /dev/termination-log` leaves it as
the container's termination message, which the controller reads from the pod's status. The warm launcher's
children run the same code through run_agent_in_child().

This module imports nothing but the standard library, so an agent image can carry it as one file
(deploy/docker/agents.Dockerfile copies it to /app/agent_runner.py).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import importlib
import inspect
import json
import math
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
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


def returned_reward(result: object) -> float | None:
    """run()'s result as a reward: an int or a float (a bool is not one), finite; anything else is None."""
    if isinstance(result, bool) or not isinstance(result, (int, float)):
        return None
    try:
        value = float(result)
    except OverflowError:  # an int too large for a float
        return None
    return value if math.isfinite(value) else None


def write_returned(path: str | int, value: float) -> None:
    """The returned reward for the controller, written whole (a reader never sees half a file).

    An int is a file descriptor the controller opened (and reads only after the agent's process ended). A path that
    exists already is written in place: Kubernetes' termination message file (`/dev/termination-log`) is a bind mount
    that cannot be replaced, and the kubelet reads it only after the container has exited."""
    text = json.dumps({"value": value})
    if isinstance(path, int):
        try:
            os.write(path, text.encode())
        except OSError as err:
            sys.stderr.write(f"agent_runner: cannot write the returned reward to fd {path}: {err}\n")
        return
    try:
        if os.path.exists(path):
            with open(path, "w") as handle:
                handle.write(text)
            return
        partial = f"{path}.partial"
        with open(partial, "w") as handle:
            handle.write(text)
        os.replace(partial, path)
    except OSError as err:
        sys.stderr.write(f"agent_runner: cannot write the returned reward to {path}: {err}\n")


def run_agent(spec: str, on_running: Callable[[], None] | None = None, result_path: str | int = "") -> int:
    try:
        agent = load_class(spec)()
    except Exception:
        traceback.print_exc()
        sys.stderr.write(f"agent_runner: cannot load agent class {spec!r}\n")
        return LOAD_FAILED
    if on_running is not None:
        on_running()
    try:
        result = agent.run()
        if inspect.isawaitable(result):
            result = asyncio.run(_wait(result))
    except Exception:
        traceback.print_exc()
        return 1
    value = returned_reward(result)
    wanted = result_path >= 0 if isinstance(result_path, int) else bool(result_path)
    if value is not None and wanted:
        write_returned(result_path, value)
    return 0


def run_agent_in_child(spec: str, on_running: Callable[[], None], result_path: str | int = "") -> int:
    """run_agent() in a forked child, ending the way an interpreter would: exit code, threads joined, atexit run."""
    try:
        code = run_agent(spec, on_running, result_path)
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except BaseException:
        traceback.print_exc()
        code = 1
    with contextlib.suppress(BaseException):
        for thread in threading.enumerate():
            if thread is not threading.current_thread() and not thread.daemon:
                thread.join()
        atexit._run_exitfuncs()
    return code


def _exit_code(value: object) -> int:
    """What the interpreter does with SystemExit's argument."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    sys.stderr.write(f"{value}\n")
    return 1


def notify_running(fd: int, launch_id: str) -> None:
    """One datagram to the controller: this launch's agent code runs now. Never blocks, never raises."""
    if fd < 0:
        return
    with contextlib.suppress(OSError):
        os.write(fd, f"{launch_id} {time.monotonic():.6f}".encode())
    with contextlib.suppress(OSError):
        os.close(fd)


async def _wait(awaitable: Any) -> Any:
    return await awaitable


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    notify_fd, launch_id = -1, ""
    result_path: str | int = ""
    while len(args) > 2 and args[0] in ("--notify-fd", "--launch-id", "--result-file", "--result-fd"):
        option, value, args = args[0], args[1], args[2:]
        if option == "--notify-fd":
            notify_fd = int(value)
        elif option == "--launch-id":
            launch_id = value
        elif option == "--result-fd":
            result_path = int(value)
        else:
            result_path = value
    if len(args) != 1:
        usage = "usage: python -m services.controller.core.agent_runner [--notify-fd N --launch-id ID] "
        sys.stderr.write(usage + "[--result-file P] module:Class\n")
        return LOAD_FAILED
    sys.argv = [sys.argv[0], args[0]]  # what the agent sees: the launch options are ours
    return run_agent(args[0], lambda: notify_running(notify_fd, launch_id), result_path)


if __name__ == "__main__":
    sys.exit(main())
