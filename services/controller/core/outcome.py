"""How one attempt ended, and the domain errors that decide it before anything runs."""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass

from services._gen.agl.v1 import rollout_pb2

from .agent_runner import returned_reward


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
EVICTED = "evicted"
INTERNAL = "internal"

# Failure kind -> the ledger's FailureReason, which the rollout's retry policy is written in. A signal the
# controller did not send (it sends one only on timeout or shutdown, reported as such) is a kill from outside.
_R = rollout_pb2
FAILURE_REASONS: dict[str, int] = {
    INVALID_CONFIG: _R.FAILURE_REASON_INVALID_CONFIG,
    SPAWN_ERROR: _R.FAILURE_REASON_LAUNCH_ERROR,
    JOB_REJECTED: _R.FAILURE_REASON_LAUNCH_ERROR,
    EXIT_CODE: _R.FAILURE_REASON_EXIT_CODE,
    SIGNAL: _R.FAILURE_REASON_KILLED,
    TIMEOUT: _R.FAILURE_REASON_TIMEOUT,
    JOB_FAILED: _R.FAILURE_REASON_JOB_FAILED,
    EVICTED: _R.FAILURE_REASON_LOST,
    VANISHED: _R.FAILURE_REASON_LOST,
    LAUNCHER_DIED: _R.FAILURE_REASON_LAUNCHER_DIED,
    SHUTDOWN: _R.FAILURE_REASON_CONTROLLER_SHUTDOWN,
    INTERNAL: _R.FAILURE_REASON_INTERNAL,
}


@dataclass(frozen=True)
class Outcome:
    """The end of one attempt: succeeded, or failed with a human-readable reason and a metric kind."""

    succeeded: bool
    reason: str = ""
    kind: str = ""
    # What an agent class's run() returned, when a number: posted as the reward unless the agent posted one.
    returned_reward: float | None = None

    @property
    def failure_reason(self) -> int:
        """The ledger's FailureReason for this failure (UNSPECIFIED for a success)."""
        return 0 if self.succeeded else FAILURE_REASONS.get(self.kind, _R.FAILURE_REASON_INTERNAL)

    @classmethod
    def success(cls) -> Outcome:
        return cls(True)

    @classmethod
    def failure(cls, kind: str, reason: str) -> Outcome:
        return cls(False, reason, kind)


def parse_returned(text: str) -> float | None:
    """The reward in a finished agent's `{"value": x}` (x an int or a float, not a bool; finite), else None.

    agent_runner writes it to --result-file: a file the local runner reads, or a Kubernetes container's
    termination message, which the API server reports in the pod's status."""
    try:
        value = json.loads(text)["value"]
    except (ValueError, KeyError, TypeError):
        return None
    return returned_reward(value)


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
