"""Infrastructure failures are not scores: which consumed rollouts a step trains on.

Pure. A rollout that failed because the machinery failed (its process was killed or lost, its launcher died, the
controller shut down, it could not be launched; a timeout when the operator says so) says nothing about the
policy, and entering its GRPO group as the fill-value reward would push its siblings' advantages up for nothing.
Such rollouts are retried first (the ledger's retry policy on every rollout the trainer creates, up to
`retry_attempts` attempts), and what still failed for such a reason is then, by `policy`:

- `drop_rollout`: left out; its group is normalised over the rest. A group left with fewer than two rollouts (when
  groups have two or more) is left out too: verl's GRPO gives a lone rollout its raw reward as its advantage.
- `drop_group`: its whole group is left out.
- `score`: kept with the fill value, the old behaviour (for comparisons only).

A step in which every consumed rollout failed for such a reason has nothing to train on: it runs again on the same
tasks (`step_redos` times at most; with external engines once one serves the current weights again, within
`redo_wait_s`) rather than stopping the run, and the lost tries are counted (`agl/step/redone`,
`agl/step/lost_rollouts`).

Agent failures (a non-zero exit, an exception in the agent, a failed Job) stay the agent's score, or are skipped
when `include_failed` is false. Every outcome is counted by reason.

- `agl/infra/{reason}`: consumed rollouts that failed for that infrastructure reason (`launch_error`, `lost`,
  `killed`, `launcher_died`, `controller_shutdown`, `engine_failed`, and `timeout` when it counts as one); present
  when zero. `engine_failed` is the trainer's own finding: the agent failed right after the proxy answered its last
  call 502, 503 or 504 (its engine died, was held back as restarted, or timed out); the ledger cannot retry those,
  so they are left out.
- `agl/infra/dropped_rollouts`: rollouts left out for an infrastructure failure, with the siblings that went with
  them (`drop_group`, a lone survivor)
- `agl/infra/dropped_groups`: groups left out entirely
- `agl/infra/retried_attempts`: attempts beyond the first among the consumed rollouts (the retries that happened)
- `agl/data/skipped_failed_rollouts`: agent-failed rollouts left out because `include_failed` is false
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from services.trainer.data.triplets import ENGINE_FAILED, RolloutTrace

# FailureReason names (without the FAILURE_REASON_ prefix) that are the infrastructure's, never the agent's.
LEDGER_REASONS = ("LAUNCH_ERROR", "LOST", "KILLED", "LAUNCHER_DIED", "CONTROLLER_SHUTDOWN")
# Reasons the trainer finds in a rollout's events (data/triplets.py): the ledger cannot retry what it never classified.
INFRA_REASONS = (*LEDGER_REASONS, ENGINE_FAILED)
TIMEOUT = "TIMEOUT"


class Policy(str, Enum):
    DROP_ROLLOUT = "drop_rollout"
    DROP_GROUP = "drop_group"
    SCORE = "score"


@dataclass(frozen=True)
class InfraSettings:
    policy: Policy = Policy.DROP_ROLLOUT
    # TIMEOUT is the agent's score unless the operator says a timeout is the infrastructure's (a slow engine).
    timeout_is_infra: bool = False
    # Attempts of each rollout before the policy applies (1: no retry).
    retry_attempts: int = 2
    # Agent-failed rollouts still train (their calls; the fill value when they posted no reward).
    include_failed: bool = True
    # A step whose every consumed rollout failed for the infrastructure (an engine restart that outlasted the agents'
    # own retries, a controller away for the whole step) runs its tasks again, at most this many times, before the
    # run stops on it; with external engines, once one of them serves the current weights again.
    step_redos: int = 2
    # How long a redo waits for that engine before the run stops.
    redo_wait_s: float = 600.0

    @property
    def reasons(self) -> tuple[str, ...]:
        return (*INFRA_REASONS, TIMEOUT) if self.timeout_is_infra else INFRA_REASONS

    @property
    def retried_reasons(self) -> tuple[str, ...]:
        """The FailureReasons the ledger retries (the trainer's own classification comes after the attempt)."""
        return tuple(r for r in self.reasons if r != ENGINE_FAILED)


@dataclass
class Selection:
    """What the step trains on, what it left out and the counts."""

    kept: list[RolloutTrace]
    dropped: list[str]
    metrics: dict[str, float]
    # Why each consumed rollout that does not train was left out (one line each).
    left_out: dict[str, str]


def is_infra_failure(trace: RolloutTrace, settings: InfraSettings) -> bool:
    return not trace.succeeded and trace.failure_reason in settings.reasons


def wholly_lost(traces: Sequence[RolloutTrace], settings: InfraSettings) -> bool:
    """Whether a step's every consumed rollout failed for the infrastructure: it says nothing of the policy, and the
    step is run again on its tasks (InfraSettings.step_redos) instead of stopping the run."""
    return bool(traces) and all(is_infra_failure(t, settings) for t in traces)


def select(traces: Sequence[RolloutTrace], settings: InfraSettings, group_size: int) -> Selection:
    """Applies the policy to one step's consumed rollouts (all of them, failed ones included)."""
    by_reason = dict.fromkeys(settings.reasons, 0)
    infra_groups: set[str] = set()
    skipped_agent = 0
    survivors: list[RolloutTrace] = []
    for trace in traces:
        if is_infra_failure(trace, settings):
            by_reason[trace.failure_reason] += 1
            infra_groups.add(trace.group_id)
            if settings.policy is Policy.SCORE:
                survivors.append(trace)
        elif not trace.succeeded and not settings.include_failed:
            skipped_agent += 1
        else:
            survivors.append(trace)
    left_out_groups: set[str] = set()
    if settings.policy is Policy.DROP_GROUP:
        left_out_groups = set(infra_groups)
    elif settings.policy is Policy.DROP_ROLLOUT and group_size >= 2:
        remaining: dict[str, int] = dict.fromkeys(infra_groups, 0)
        for trace in survivors:
            if trace.group_id in remaining:
                remaining[trace.group_id] += 1
        left_out_groups = {group for group, count in remaining.items() if count < 2}
    kept = [t for t in survivors if t.group_id not in left_out_groups]
    kept_ids = {t.rollout_id for t in kept}
    kept_groups = {t.group_id for t in kept}
    skipped_ids = (
        {t.rollout_id for t in traces}
        - {t.rollout_id for t in survivors}
        - {t.rollout_id for t in traces if is_infra_failure(t, settings)}
    )
    dropped = [t.rollout_id for t in traces if t.rollout_id not in kept_ids and t.rollout_id not in skipped_ids]
    left_out: dict[str, str] = {}
    for t in traces:
        if t.rollout_id in skipped_ids:
            left_out[t.rollout_id] = f"the agent's failure ({t.failure_reason or 'UNSPECIFIED'}), include_failed=false"
        elif t.rollout_id in kept_ids:
            continue
        elif is_infra_failure(t, settings):
            left_out[t.rollout_id] = f"an infrastructure failure ({t.failure_reason}), policy {settings.policy.value}"
        else:
            left_out[t.rollout_id] = f"its group lost rollouts to the infrastructure, policy {settings.policy.value}"
    metrics = {f"agl/infra/{reason.lower()}": float(count) for reason, count in by_reason.items()}
    metrics["agl/infra/dropped_rollouts"] = float(len(dropped))
    metrics["agl/infra/dropped_groups"] = float(len(infra_groups - kept_groups))
    metrics["agl/infra/retried_attempts"] = float(sum(max(t.attempts - 1, 0) for t in traces))
    metrics["agl/data/skipped_failed_rollouts"] = float(skipped_agent)
    return Selection(kept, dropped, metrics, left_out)
