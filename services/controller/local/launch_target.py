"""What the local runner executes for a rollout: an explicit command, or an agent class via agent_runner."""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..core.outcome import ConfigError

RUNNER_MODULE = "services.controller.core.agent_runner"
_DOTTED = r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*"
_CLASS_RE = re.compile(rf"(?P<module>{_DOTTED})(?::(?P<attr>{_DOTTED}))?")


def split_agent_class(spec: str) -> tuple[str, str]:
    """ "pkg.mod:Class" or "pkg.mod.Class" -> ("pkg.mod", "Class"). Raises ConfigError on anything else."""
    match = _CLASS_RE.fullmatch(spec.strip())
    if match is None:
        raise ConfigError(f"agent_class {spec!r} is not 'module:Class' or 'module.Class'")
    module, attr = match["module"], match["attr"]
    if attr is None:
        if "." not in module:
            raise ConfigError(f"agent_class {spec!r} names no class: use 'module:Class' or 'module.Class'")
        module, _, attr = module.rpartition(".")
    return module, attr


def local_argv(command: Sequence[str], agent_class: str, python: str) -> list[str]:
    """The argv of the agent process: `command` when given (it wins), else agent_runner on the class."""
    if command:
        if not command[0]:
            raise ConfigError("local command has an empty program name")
        return list(command)
    if agent_class.strip():
        module, attr = split_agent_class(agent_class)
        return [python, "-m", RUNNER_MODULE, f"{module}:{attr}"]
    raise ConfigError("rollout config names no local launch target (config.local.agent_class or config.local.command)")
