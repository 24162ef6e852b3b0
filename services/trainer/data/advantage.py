"""Rollout-level advantages with verl's own estimators.

Each rollout is one sample of its group's reward distribution, however many rows it produced. The
advantage is therefore computed once per rollout (one scalar reward, grouped by the sample's group id)
with the estimator verl registers under the configured name, then broadcast to every row of the rollout.
Computing it per row would let a rollout that made more calls pull its group's mean towards itself.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from verl.trainer.ppo import core_algos

from services.trainer.data.aggregation import Row

# Estimators that need more than one scalar reward per rollout (values, baselines, log-probs, raw batches).
_UNSUPPORTED = frozenset({"gae", "remax", "optimal_token_baseline", "tir_optimal_token_baseline", "gdpo"})


class InconsistentRolloutError(ValueError):
    """Rows of one rollout disagree on its reward or group."""


def rollout_table(rows: Sequence[Row]) -> tuple[list[str], list[float], list[str]]:
    """(rollout ids, rewards, group ids), one entry per rollout in first-seen order; checks consistency."""
    order: list[str] = []
    seen: dict[str, tuple[float, str]] = {}
    for row in rows:
        known = seen.get(row.rollout_id)
        if known is None:
            seen[row.rollout_id] = (row.reward, row.group_id)
            order.append(row.rollout_id)
        elif known != (row.reward, row.group_id):
            raise InconsistentRolloutError(
                f"rows of rollout {row.rollout_id} disagree: reward/group {known} vs {(row.reward, row.group_id)}; "
                "every row of a rollout must carry the rollout's reward and group"
            )
    return order, [seen[r][0] for r in order], [seen[r][1] for r in order]


def rollout_advantages(
    rows: Sequence[Row],
    estimator: str = "grpo",
    *,
    norm_adv_by_std_in_grpo: bool = True,
    algo_config: Any = None,
) -> dict[str, float]:
    """Scalar advantage per rollout id, from verl's estimator applied to one reward per rollout."""
    name = estimator.value if hasattr(estimator, "value") else str(estimator)
    if name in _UNSUPPORTED:
        raise ValueError(
            f"advantage estimator {name!r} is not an outcome estimator; rollout-level advantages support "
            "grpo, grpo_vectorized, grpo_passk, rloo, rloo_vectorized, opo, gpg, reinforce_plus_plus(_baseline)"
        )
    rollout_ids, rewards, groups = rollout_table(rows)
    if not rollout_ids:
        return {}
    fn = core_algos.get_adv_estimator_fn(name)
    accepted = inspect.signature(fn).parameters
    kwargs: dict[str, Any] = {
        "token_level_rewards": torch.tensor(rewards, dtype=torch.float32).unsqueeze(-1),
        "response_mask": torch.ones(len(rewards), 1, dtype=torch.float32),
        "index": np.array(groups, dtype=object),
    }
    if "config" in accepted:
        kwargs["config"] = algo_config
    if "norm_adv_by_std_in_grpo" in accepted:
        kwargs["norm_adv_by_std_in_grpo"] = norm_adv_by_std_in_grpo
    advantages, _ = fn(**kwargs)
    values = advantages[:, 0].tolist()
    return dict(zip(rollout_ids, values, strict=True))


def zero_variance_groups(rows: Sequence[Row]) -> set[str]:
    """Groups with at least two rollouts that all got the same reward (their advantages are all zero)."""
    _, rewards, groups = rollout_table(rows)
    by_group: dict[str, list[float]] = {}
    for reward, group in zip(rewards, groups, strict=True):
        by_group.setdefault(group, []).append(reward)
    return {g for g, rs in by_group.items() if len(rs) > 1 and max(rs) == min(rs)}
