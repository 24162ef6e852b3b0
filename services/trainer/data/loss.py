"""The `per_rollout_mean` policy loss, registered in verl's policy-loss registry.

With trajectory breaks or transition-level rows, one rollout becomes several rows. Token-mean would let a
rollout weigh in proportion to its tokens, seq-mean in proportion to its rows. Here every rollout weighs
the same: each response token of row i (of rollout r) gets the weight

    w_i = (N_rows / N_rollouts) / T_r

where T_r is the total number of response tokens of all rows of rollout r in the step batch and
N_rows / N_rollouts is the batch's mean number of rows per rollout. The clipped PPO token losses are
multiplied by w and aggregated with verl's "seq-mean-token-sum" (sum over tokens, mean over the rows of
the global mini-batch). Over a whole step batch this is exactly

    loss = (1 / N_rollouts) * sum_r (sum of rollout r's token losses / T_r)

i.e. the mean over rollouts of each rollout's token-mean, whatever number of rows it produced.

verl hands a policy loss only (old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
rollout_is_weights); the per-token weights therefore travel in `rollout_is_weights` (multiplied into
verl's importance-sampling weights when rollout correction is on, see `apply_row_weights`).

Worker processes import this module through `actor_rollout_ref.model.external_lib` (see the trainer's
Hydra config), which is what registers the loss there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from verl import DataProto
from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla, register_policy_loss

PER_ROLLOUT_MEAN = "per_rollout_mean"
ROW_WEIGHTS_KEY = "agl_row_weights"
IS_WEIGHTS_KEY = "rollout_is_weights"


def per_rollout_token_weights(rollout_ids: Sequence[str], response_mask: torch.Tensor) -> torch.Tensor:
    """Per-token weights (B, R): (N_rows / N_rollouts) / T_r on response tokens, 0 elsewhere."""
    mask = response_mask.to(torch.float32)
    if mask.shape[0] == 0:
        return mask.clone()
    _, inverse = np.unique(np.asarray(rollout_ids, dtype=object).astype(str), return_inverse=True)
    index = torch.as_tensor(inverse, dtype=torch.long)
    n_rollouts = int(index.max().item()) + 1
    tokens = torch.zeros(n_rollouts, dtype=torch.float32).index_add_(0, index, mask.sum(dim=-1))
    rows_per_rollout = mask.shape[0] / n_rollouts
    per_row = rows_per_rollout / tokens.clamp(min=1.0)[index]
    return mask * per_row.unsqueeze(-1)


def apply_row_weights(batch: DataProto) -> None:
    """Moves the adapter's row weights into `rollout_is_weights` (multiplying any IS weights already there)."""
    weights = batch.batch.pop(ROW_WEIGHTS_KEY)
    existing = batch.batch.get(IS_WEIGHTS_KEY, None)
    batch.batch[IS_WEIGHTS_KEY] = weights if existing is None else existing * weights


@register_policy_loss(PER_ROLLOUT_MEAN)  # type: ignore[arg-type]
def compute_policy_loss_per_rollout_mean(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Clipped PPO objective weighted so that every rollout counts once (see the module docstring)."""
    if rollout_is_weights is None:
        raise ValueError(
            "policy loss 'per_rollout_mean' needs per-token rollout weights in batch['rollout_is_weights']; "
            "they are written by the AGL trainer's data path (services.trainer.data.loss.apply_row_weights)"
        )
    del loss_agg_mode  # the weights already normalise per rollout; rows are summed then averaged
    return compute_policy_loss_vanilla(
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=response_mask,
        loss_agg_mode="seq-mean-token-sum",
        config=config,
        rollout_is_weights=rollout_is_weights,
    )
