"""verl 0.9.1's rollout correction in AGL's step, on CPU with real verl objects and the composed Hydra config.

Rows whose engine gave no log-probs keep the batch's `rollout_log_probs` (flagged, then filled with the old
log-probs: ratio 1); the IS weights are verl's (`compute_rollout_correction_and_add_to_batch`) and reach the
per_rollout_mean loss multiplied by AGL's row weights.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from hydra import compose, initialize_config_dir
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights

from services.trainer.config import CONFIG_DIR, CONFIG_NAME
from services.trainer.data.adapter import DataPathSettings, build_training_batch
from services.trainer.data.batch import MISSING_ROLLOUT_LOG_PROBS_KEY
from services.trainer.data.loss import IS_WEIGHTS_KEY, PER_ROLLOUT_MEAN, ROW_WEIGHTS_KEY, apply_row_weights
from services.trainer.data.triplets import trace_from_events
from services.trainer.verl.correction import apply_rollout_correction

from .events import call, reward

pytestmark = pytest.mark.trainer

SETTINGS = DataPathSettings(level="transition", max_prompt_length=2, max_response_length=3)


def _algorithm(*overrides: str):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(config_name=CONFIG_NAME, overrides=list(overrides)).algorithm


def _batch():
    counts: Counter[str] = Counter()
    traces = [
        trace_from_events(
            "r1",
            "g1",
            "d1",
            [call([1, 2], [3, 4, 5], [-0.5, -1.0, -2.0]), reward(1.0)],
            counts=counts,
            reward_fillna_value=0.0,
        ),
        trace_from_events(
            "r2", "g1", "d1", [call([1, 2], [6, 7]), reward(0.0)], counts=counts, reward_fillna_value=0.0
        ),  # no log-probs
        trace_from_events(
            "r3", "g2", "d2", [call([1], [8], [-0.1]), reward(1.0)], counts=counts, reward_fillna_value=0.0
        ),
    ]
    data = build_training_batch(traces, SETTINGS).data
    assert data is not None and data.non_tensor_batch["rollout_id"].tolist() == ["r1", "r2", "r3"]
    return data


def _with_old_log_probs(data):
    # What the actor's recomputation would give: off by +0.3, -0.2 and +1.5 (past the 2.0 cap) on r1's tokens.
    old = torch.tensor([[-0.2, -1.2, -0.5], [-0.7, -0.9, -3.0], [-0.4, -9.0, -9.0]])
    data.batch["old_log_probs"] = old
    return old


def test_rows_without_engine_log_probs_keep_the_batchs_and_are_flagged() -> None:
    data = _batch()
    expected = torch.tensor([[-0.5, -1.0, -2.0], [0.0, 0.0, 0.0], [-0.1, 0.0, 0.0]])
    assert torch.equal(data.batch["rollout_log_probs"], expected)
    assert data.batch[MISSING_ROLLOUT_LOG_PROBS_KEY].tolist() == [False, True, False]
    # Every row with log-probs: no flag at all; no row with them: no rollout_log_probs (as before).
    counts: Counter[str] = Counter()
    full = build_training_batch(
        [trace_from_events("r1", "g1", "d", [call([1], [2], [-0.5])], counts=counts, reward_fillna_value=0.0)], SETTINGS
    )
    assert "rollout_log_probs" in full.data.batch and MISSING_ROLLOUT_LOG_PROBS_KEY not in full.data.batch
    none = build_training_batch(
        [trace_from_events("r1", "g1", "d", [call([1], [2])], counts=counts, reward_fillna_value=0.0)], SETTINGS
    )
    assert "rollout_log_probs" not in none.data.batch and MISSING_ROLLOUT_LOG_PROBS_KEY not in none.data.batch


def test_token_is_weights_are_verls_with_missing_rows_on_policy() -> None:
    data = _batch()
    old = _with_old_log_probs(data)
    algorithm = _algorithm(
        "algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.rollout_is_threshold=2.0"
    )
    metrics = apply_rollout_correction(data, algorithm)

    mask = data.batch["response_mask"].to(torch.float32)
    assert mask.tolist() == [[1, 1, 1], [1, 1, 0], [1, 0, 0]]
    # Hand computation: truncated token IS, exp(old - rollout) capped at 2; r2 took the old log-probs (ratio 1).
    expected = torch.tensor(
        [
            [torch.exp(torch.tensor(0.3)), torch.exp(torch.tensor(-0.2)), 2.0],
            [1.0, 1.0, 0.0],
            [torch.exp(torch.tensor(-0.3)), 0.0, 0.0],
        ]
    )
    weights = data.batch[IS_WEIGHTS_KEY]
    assert torch.allclose(weights, expected, rtol=1e-5)
    filled = data.batch["rollout_log_probs"]
    assert filled[1].tolist() == pytest.approx(old[1].tolist())
    verl_weights, _ = compute_rollout_correction_weights(
        old - filled, mask, rollout_is="token", rollout_is_threshold=2.0
    )
    assert torch.allclose(weights, verl_weights)
    assert MISSING_ROLLOUT_LOG_PROBS_KEY not in data.batch
    assert metrics["agl/data/rows_without_rollout_log_probs"] == 1.0
    assert metrics["rollout_corr/rollout_is_max"] == pytest.approx(2.0)
    assert "training/rollout_probs_diff_mean" in metrics and "rollout_corr/kl" in metrics

    # AGL's per-rollout weights multiply in, and the loss sees both.
    row_weights = data.batch[ROW_WEIGHTS_KEY].clone()
    apply_row_weights(data)
    assert torch.allclose(data.batch[IS_WEIGHTS_KEY], expected * row_weights, rtol=1e-5)
    advantages = torch.tensor([[1.0], [-1.0], [0.5]]) * mask
    new = old + 0.05
    loss, _ = core_algos.get_policy_loss_fn(PER_ROLLOUT_MEAN)(
        old_log_prob=old,
        log_prob=new,
        advantages=advantages,
        response_mask=mask.bool(),
        config=_actor_config(),
        rollout_is_weights=data.batch[IS_WEIGHTS_KEY],
    )
    ratio = torch.exp(new - old)
    per_token = torch.maximum(-advantages * ratio, -advantages * torch.clamp(ratio, 0.8, 1.2))
    by_hand = (per_token * expected * row_weights * mask).sum() / 3
    assert loss.item() == pytest.approx(by_hand.item(), rel=1e-5)


def test_rejection_sampling_masks_tokens_as_verl_does() -> None:
    data = _batch()
    _with_old_log_probs(data)
    algorithm = _algorithm(
        "algorithm.rollout_correction.rollout_rs=token_k1",
        "algorithm.rollout_correction.rollout_rs_threshold='0.5_1.5'",
    )
    metrics = apply_rollout_correction(data, algorithm)
    # Ratios: r1 e^0.3, e^-0.2, e^1.5 (> 1.5: rejected); r2 1 (filled); r3 e^-0.3 (kept).
    assert data.batch["response_mask"].tolist() == [[1, 1, 0], [1, 1, 0], [1, 0, 0]]
    assert IS_WEIGHTS_KEY not in data.batch  # rollout_is unset: no weights, as in verl
    assert any(key.startswith("rollout_corr/rollout_rs") for key in metrics)


def test_default_config_only_measures_and_fills() -> None:
    data = _batch()
    old = _with_old_log_probs(data)
    mask_before = data.batch["response_mask"].clone()
    metrics = apply_rollout_correction(data, _algorithm())
    assert IS_WEIGHTS_KEY not in data.batch and torch.equal(data.batch["response_mask"], mask_before)
    assert data.batch["rollout_log_probs"][1].tolist() == pytest.approx(old[1].tolist())
    assert "rollout_corr/kl" in metrics


def test_misuse_is_a_clear_error() -> None:
    data = _batch()
    with pytest.raises(ValueError, match="old log-probs first"):
        apply_rollout_correction(data, _algorithm())
    _with_old_log_probs(data)
    with pytest.raises(ValueError, match="bypass_mode"):
        apply_rollout_correction(data, _algorithm("algorithm.rollout_correction.bypass_mode=true"))
    data = _batch()
    _with_old_log_probs(data)
    apply_row_weights(data)
    with pytest.raises(ValueError, match=r"before loss\.apply_row_weights"):
        apply_rollout_correction(data, _algorithm())


def _actor_config():
    from omegaconf import OmegaConf

    return OmegaConf.create({"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "global_batch_info": {}})
