"""Rollout-level advantages, the per_rollout_mean loss and mini-batch alignment (real verl, CPU torch)."""

from __future__ import annotations

import math
import random
from collections import Counter

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl import DataProto
from verl.trainer.ppo import core_algos

from services.trainer.data.adapter import DataPathSettings, build_training_batch
from services.trainer.data.advantage import InconsistentRolloutError, rollout_advantages, zero_variance_groups
from services.trainer.data.aggregation import Row
from services.trainer.data.alignment import align_rows
from services.trainer.data.loss import (
    IS_WEIGHTS_KEY,
    PER_ROLLOUT_MEAN,
    ROW_WEIGHTS_KEY,
    apply_row_weights,
    per_rollout_token_weights,
)
from services.trainer.data.triplets import trace_from_events

from .events import call, reward

pytestmark = pytest.mark.trainer


def row(rollout_id: str, group: str, reward_value: float, n_tokens: int = 1) -> Row:
    return Row(rollout_id, group, group, reward_value, 0, 1, [1], [5] * n_tokens, [1] * n_tokens, None)


def test_single_row_rollouts_match_verls_grpo() -> None:
    rewards = [1.0, 0.0, 0.5, 2.0, -1.0, 3.0]
    groups = ["a", "a", "a", "b", "b", "c"]
    rows = [row(f"r{i}", g, r) for i, (g, r) in enumerate(zip(groups, rewards, strict=True))]
    ours = rollout_advantages(rows, "grpo")
    scores = torch.zeros(6, 3)
    scores[:, 2] = torch.tensor(rewards)
    verl_adv, _ = core_algos.compute_grpo_outcome_advantage(
        token_level_rewards=scores, response_mask=torch.ones(6, 3), index=np.array(groups, dtype=object)
    )
    assert [ours[f"r{i}"] for i in range(6)] == pytest.approx(verl_adv[:, 0].tolist(), abs=1e-6)
    # Group "c" has one rollout: verl keeps its score (mean 0, std 1).
    assert ours["r5"] == pytest.approx(3.0, abs=1e-5)


def test_multi_row_rollout_counts_once_in_its_group() -> None:
    # r0 produced three rows, r1 one: the group mean must be (1 + 0) / 2, not (1 + 1 + 1 + 0) / 4.
    rows = [row("r0", "g", 1.0), row("r0", "g", 1.0), row("r0", "g", 1.0), row("r1", "g", 0.0)]
    adv = rollout_advantages(rows, "grpo")
    std = torch.tensor([1.0, 0.0]).std().item()
    assert adv["r0"] == pytest.approx(0.5 / (std + 1e-6), abs=1e-6)
    assert adv["r1"] == pytest.approx(-0.5 / (std + 1e-6), abs=1e-6)
    # Dr.GRPO flavour (no std): plain difference from the rollout mean.
    plain = rollout_advantages(rows, "grpo", norm_adv_by_std_in_grpo=False)
    assert plain == pytest.approx({"r0": 0.5, "r1": -0.5})
    # Another registered outcome estimator works through the same path (RLOO: leave-one-out mean).
    rloo = rollout_advantages(rows, "rloo")
    assert rloo["r0"] == pytest.approx(1.0 * 2 / 1 - 0.5 * 2, abs=1e-6)


def test_advantage_is_broadcast_to_every_row_of_the_rollout() -> None:
    counts: Counter[str] = Counter()
    a = trace_from_events(
        "ra",
        "g",
        "d",
        [call([1], [2, 3], [-1, -1]), call([7], [8], [-1]), reward(1.0)],
        reward_fillna_value=0.0,
        counts=counts,
    )
    b = trace_from_events("rb", "g", "d", [call([1], [4], [-1]), reward(0.0)], reward_fillna_value=0.0, counts=counts)
    out = build_training_batch([a, b], DataPathSettings(level="trajectory", max_prompt_length=2, max_response_length=3))
    adv = out.data.batch["advantages"]
    expected = 0.5 / (torch.tensor([1.0, 0.0]).std().item() + 1e-6)
    want = torch.tensor([[expected, expected, 0], [expected, 0, 0], [-expected, 0, 0]])
    assert torch.allclose(adv, want, atol=1e-6)
    assert torch.equal(out.data.batch["returns"], adv)


def test_rows_of_one_rollout_must_agree() -> None:
    with pytest.raises(InconsistentRolloutError, match="r0"):
        rollout_advantages([row("r0", "g", 1.0), row("r0", "g", 0.0)])
    with pytest.raises(InconsistentRolloutError, match="r0"):
        rollout_advantages([row("r0", "g", 1.0), row("r0", "h", 1.0)])
    with pytest.raises(ValueError, match="gae"):
        rollout_advantages([row("r0", "g", 1.0)], "gae")


def test_weights_make_every_rollout_count_once() -> None:
    # Rollout A: two rows of 2 and 1 response tokens (T=3); rollout B: one row of 4 tokens (T=4).
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]])
    weights = per_rollout_token_weights(["A", "A", "B"], mask)
    rows_per_rollout = 3 / 2
    want = torch.tensor(
        [
            [rows_per_rollout / 3, rows_per_rollout / 3, 0, 0],
            [rows_per_rollout / 3, 0, 0, 0],
            [rows_per_rollout / 4] * 4,
        ]
    )
    assert torch.allclose(weights, want)


def _actor_config():
    return OmegaConf.create({"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "global_batch_info": {}})


def test_per_rollout_mean_is_the_mean_of_rollout_token_means() -> None:
    loss_fn = core_algos.get_policy_loss_fn(PER_ROLLOUT_MEAN)
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.float32)
    advantages = torch.tensor([[1.0], [1.0], [-0.5]]) * mask
    gen = torch.Generator().manual_seed(0)
    old = -torch.rand(3, 4, generator=gen)
    new = old + 0.05 * torch.randn(3, 4, generator=gen)
    weights = per_rollout_token_weights(["A", "A", "B"], mask)
    loss, metrics = loss_fn(
        old_log_prob=old,
        log_prob=new,
        advantages=advantages,
        response_mask=mask.bool(),
        loss_agg_mode="token-mean",
        config=_actor_config(),
        rollout_is_weights=weights,
    )
    # Hand computation: clipped PPO per token, token-mean inside each rollout, mean over rollouts.
    ratio = torch.exp(new - old)
    per_token = torch.maximum(-advantages * ratio, -advantages * torch.clamp(ratio, 0.8, 1.2))
    rollout_a = (per_token[0, :2].sum() + per_token[1, :1].sum()) / 3
    rollout_b = per_token[2].sum() / 4
    assert loss.item() == pytest.approx(((rollout_a + rollout_b) / 2).item(), rel=1e-5)
    assert "actor/pg_clipfrac" in metrics

    # With ratio 1 the loss is minus the mean rollout advantage, whatever the number of rows.
    flat, _ = loss_fn(
        old_log_prob=old,
        log_prob=old,
        advantages=advantages,
        response_mask=mask.bool(),
        config=_actor_config(),
        rollout_is_weights=weights,
    )
    assert flat.item() == pytest.approx(-(1.0 + -0.5) / 2, rel=1e-6)
    # verl's token-mean would weigh rollout B by its 4 tokens against A's 3.
    token_mean = core_algos.agg_loss(per_token, mask, "token-mean")
    assert not math.isclose(token_mean.item(), loss.item(), rel_tol=1e-3)


def test_per_rollout_mean_without_weights_is_a_clear_error() -> None:
    loss_fn = core_algos.get_policy_loss_fn(PER_ROLLOUT_MEAN)
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="rollout_is_weights"):
        loss_fn(x, x, x, x.bool(), "token-mean", _actor_config(), None)


def test_row_weights_move_into_importance_weights() -> None:
    weights = torch.tensor([[0.5, 0.5], [2.0, 0.0]])
    data = DataProto.from_dict(tensors={ROW_WEIGHTS_KEY: weights.clone()})
    apply_row_weights(data)
    assert torch.equal(data.batch[IS_WEIGHTS_KEY], weights) and ROW_WEIGHTS_KEY not in data.batch
    data = DataProto.from_dict(tensors={ROW_WEIGHTS_KEY: weights.clone(), IS_WEIGHTS_KEY: torch.full((2, 2), 0.5)})
    apply_row_weights(data)
    assert torch.equal(data.batch[IS_WEIGHTS_KEY], weights * 0.5)


def test_alignment_drops_zero_variance_groups_first_then_random_rows() -> None:
    groups = ["a", "a", "z", "z", "z", "b", "b", "b", "b", "c"]
    out = align_rows(groups, {"z"}, mini_batch_rows=3, max_updates=2, divisor=1, rng=random.Random(1))
    assert out.num_updates == 2 and out.mini_batch_rows == 3 and len(out.keep) == 6
    assert not {2, 3, 4} & set(out.keep)
    assert out.dropped_zero_variance_rows == 3 and out.dropped_random_rows == 1
    uncapped = align_rows(groups, set(), mini_batch_rows=3, max_updates=0, divisor=1, rng=random.Random(1))
    assert uncapped.num_updates == 3 and len(uncapped.keep) == 9 and uncapped.dropped_random_rows == 1
    small = align_rows(groups[:5], {"z"}, mini_batch_rows=8, max_updates=4, divisor=2, rng=random.Random(1))
    assert small.num_updates == 1 and small.mini_batch_rows == 4 and small.keep == [0, 1, 3, 4]
    assert small.dropped_zero_variance_rows == 1
    assert align_rows(["a"], set(), mini_batch_rows=4, max_updates=1, divisor=2, rng=random.Random(1)).keep == []


def test_zero_variance_groups_need_two_rollouts_with_one_reward() -> None:
    rows = [row("r0", "z", 1.0), row("r1", "z", 1.0), row("r2", "v", 1.0), row("r3", "v", 0.0), row("r4", "s", 1.0)]
    assert zero_variance_groups(rows) == {"z"}


def test_batch_alignment_metrics_and_update_count() -> None:
    counts: Counter[str] = Counter()
    traces = []
    for i, (group, value) in enumerate([("z", 1.0), ("z", 1.0), ("v", 1.0), ("v", 0.0), ("v", 0.5)]):
        events = [call([1], [2], [-0.1]), reward(value)]
        traces.append(trace_from_events(f"r{i}", group, group, events, reward_fillna_value=0.0, counts=counts))
    s = DataPathSettings(max_prompt_length=2, max_response_length=2, mini_batch_rows=2, max_ppo_update_times=1)
    out = build_training_batch(traces, s)
    assert len(out.data) == 2 and out.num_updates == 1
    assert set(out.data.non_tensor_batch["uid"]) == {"v"}
    assert out.metrics["agl/align/dropped_zero_variance_rows"] == 2.0
    assert out.metrics["agl/align/dropped_random_rows"] == 1.0
