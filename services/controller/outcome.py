"""How one attempt ended, and the domain errors that decide it before anything runs."""

from __future__ import annotations

import signal
from dataclasses import dataclass


class ControllerError(Exception):
    """Base of the controller's domain errors."""


class ConfigError(ControllerError):
    """The rollout's config (launch target, env_map, Job template) is unusable: the rollout fails at once."""


# Failure kinds: the low-cardinality `reason` label of the failed-rollouts metric.
INVALID_CONFIG = "invalid_config"
SPAWN_ERROR = "spawn_error"
EXIT_CODE = "exit_code"
SIGNAL = "signal"
TIMEOUT = "timeout"
JOB_FAILED = "job_failed"
JOB_REJECTED = "job_rejected"
VANISHED = "vanished"
LAUNCHER_DIED = "launcher_died"
SHUTDOWN = "shutdown"


@dataclass(frozen=True)
class Outcome:
    """The end of one attempt: succeeded, or failed with a human-readable reason and a metric kind."""

    succeeded: bool
    reason: str = ""
    kind: str = ""

    @classmethod
    def success(cls) -> Outcome:
        return cls(True)

    @classmethod
    def failure(cls, kind: str, reason: str) -> Outcome:
        return cls(False, reason, kind)


def format_seconds(seconds: float) -> str:
    """30.0 -> "30", 2.5 -> "2.5"."""
    return f"{seconds:g}"


def timed_out(seconds: float, detail: str = "") -> Outcome:
    reason = f"timed out after {format_seconds(seconds)} s"
    return Outcome.failure(TIMEOUT, f"{reason} {detail}".strip())


def exit_outcome(returncode: int, detail: str = "") -> Outcome:
    """Maps a subprocess return code (negative: killed by that signal) to an outcome."""
    if returncode == 0:
        return Outcome.success()
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return Outcome.failure(SIGNAL, f"agent killed by {name} {detail}".strip())
    return Outcome.failure(EXIT_CODE, f"agent exited with code {returncode} {detail}".strip())
