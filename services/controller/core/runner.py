"""The small interface the controller drives, whatever runs the agents (local processes or Kubernetes Jobs)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from services._gen.agl.v1 import rollout_pb2

from .agent_env import parse_input
from .outcome import Outcome


@dataclass(frozen=True)
class LaunchPlan:
    """Everything needed to launch one attempt, decided before the rollout is claimed."""

    rollout_id: str
    attempt_id: str
    # Recorded in the ledger on claim: Job name, log file.
    launcher_ref: str
    timeout_s: float
    # Runner-specific part: argv and env for the local runner, the Job manifest for Kubernetes.
    detail: Any


class Runner(Protocol):
    """What runs agents. prepare() launches nothing and may raise ConfigError; the rest talks to the world."""

    name: str
    # True: agents die with the controller (local processes), so shutdown fails their rollouts.
    # False: agents outlive it (Jobs), a restarted controller adopts them.
    kills_on_shutdown: bool

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def prepare(self, rollout: rollout_pb2.Rollout, attempt_id: str) -> LaunchPlan:
        """The launch plan; for a Job, its template is rendered in a worker process with limits."""

    async def admit(self) -> None:
        """Waits until one more launch is allowed (rate limit); called before claiming."""

    async def run(self, plan: LaunchPlan, launched: Callable[[str], None]) -> Outcome:
        """Launches the claimed attempt, calls launched(mode) once it runs (mode: how it was started, a label of
        agl_controller_launched_total), and returns how it ended."""

    async def resume(self, rollout: rollout_pb2.Rollout, cause: str = "") -> Outcome:
        """For a rollout an earlier run of this controller left running, or (`cause` says why) one taken over from a
        controller whose lease expired: adopt and wait, or explain its loss."""


def timeout_of(rollout: rollout_pb2.Rollout, default_s: float) -> float:
    """The rollout's timeout, or the controller's default when it sets none."""
    timeout = rollout.config.timeout_seconds
    return timeout if timeout > 0 else default_s


def template_context(rollout: rollout_pb2.Rollout, attempt_id: str) -> dict[str, Any]:
    """What env_map paths and Job templates can refer to."""
    return {
        "input": parse_input(rollout.input_json),
        "rollout_id": rollout.rollout_id,
        "attempt_id": attempt_id,
        "is_train": rollout.is_train,
    }
