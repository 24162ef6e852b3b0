"""Which consumed rollouts the trainer deletes: those of steps that fell out of the run's retention window.

`keep_steps` K keeps the consumed rollouts of the run's last K steps (by their `agl_step` label) in the
ledger, so `agl rollouts`, `agl rollout ID` and the console can show what the agent said; older steps'
rollouts are deleted, so the ledger stays bounded. 0 deletes them right after the step; -1 keeps all.

The decision is made from the ledger's own listing of the run (labels `agl_run` and `agl_step`), never from
ids remembered in memory: a restarted trainer deletes the steps that fell out of the window while another
process ran, and other runs' rollouts, which carry another `agl_run`, are never looked at. Pure.
"""

from __future__ import annotations

from collections.abc import Container, Iterable

from services._gen.agl.v1 import rollout_pb2
from services.trainer.rollouts.specs import LABEL_STEP

KEEP_ALL = -1
# The states a rollout stops in: only a rollout in one of them may have been consumed.
TERMINAL_STATES = (rollout_pb2.ROLLOUT_STATE_SUCCEEDED, rollout_pb2.ROLLOUT_STATE_FAILED)


def check_keep_steps(keep_steps: object) -> int:
    """The window as an int; ValueError (naming `keep_steps`) for anything but an integer >= -1."""
    if isinstance(keep_steps, bool) or not isinstance(keep_steps, int) or keep_steps < KEEP_ALL:
        raise ValueError(
            f"keep_steps={keep_steps!r}: use a number of steps >= 1, 0 to delete consumed rollouts right after "
            "their step, or -1 to keep them all"
        )
    return keep_steps


def step_of(rollout: rollout_pb2.Rollout) -> int | None:
    """The step a rollout was created for (its `agl_step` label), None when it has no such label."""
    raw = rollout.metadata.labels.get(LABEL_STEP, "")
    try:
        return int(raw)
    except ValueError:
        return None


def expired(
    rollouts: Iterable[rollout_pb2.Rollout], *, latest_step: int, keep_steps: int, in_flight: Container[str]
) -> list[str]:
    """Ids of the run's finished rollouts older than the window (latest_step - keep_steps, latest_step].

    `rollouts` are the run's rollouts as listed from the ledger; a rollout still in flight (a group not yet
    consumed, e.g. carried over in async mode) or not finished is never chosen, nor one without a step label.
    """
    if keep_steps == KEEP_ALL:
        return []
    oldest_kept = latest_step - keep_steps + 1
    chosen = []
    for rollout in rollouts:
        step = step_of(rollout)
        if (
            step is not None
            and step < oldest_kept
            and rollout.status.state in TERMINAL_STATES
            and rollout.rollout_id not in in_flight
        ):
            chosen.append(rollout.rollout_id)
    return chosen
