"""verl's rollout correction in AGL's step: importance weights between the engine's and the trainer's policy.

Guarantee: once the old log-probs are in the batch, the batch gets exactly what verl 0.9.1's `fit` gives it
(`RayPPOTrainer.fit`, the decoupled branch: recompute old log-probs, then
`rollout_corr_helper.compute_rollout_correction_and_add_to_batch`): `rollout_is_weights` when
`algorithm.rollout_correction.rollout_is` is set, the rejection mask of `rollout_rs` in `response_mask`,
and the `rollout_corr/*` and `training/rollout_probs_diff_*` metrics. verl's bypass mode (old log-probs
taken from the engine) is refused at start (`preflight`): it swaps the policy loss for verl's own.

Rows whose engine gave no log-probs (flagged by `batch.rows_to_dataproto`) get the recomputed old log-probs
as their rollout log-probs first: ratio 1, treated as on-policy, so they neither skew the weights nor are
rejected.

Call it after the old log-probs are unioned into the batch and before `loss.apply_row_weights` (which
multiplies AGL's per-rollout weights into the IS weights made here).
"""

from __future__ import annotations

import logging
from typing import Any

from verl import DataProto
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch
from verl.utils.debug.metrics import calculate_debug_metrics

from services.trainer.data.batch import MISSING_ROLLOUT_LOG_PROBS_KEY
from services.trainer.data.loss import IS_WEIGHTS_KEY, ROW_WEIGHTS_KEY

log = logging.getLogger(__name__)

ROLLOUT_LOG_PROBS = "rollout_log_probs"
OLD_LOG_PROBS = "old_log_probs"


def fill_missing_rollout_log_probs(batch: DataProto) -> int:
    """Rows flagged as lacking engine log-probs take the old log-probs; drops the flag. Returns the row count."""
    missing = batch.batch.pop(MISSING_ROLLOUT_LOG_PROBS_KEY, None)
    if missing is None:
        return 0
    rows = missing.to(bool)
    count = int(rows.sum().item())
    if count:
        filled = batch.batch[ROLLOUT_LOG_PROBS].clone()
        filled[rows] = batch.batch[OLD_LOG_PROBS][rows].to(filled.dtype)
        batch.batch[ROLLOUT_LOG_PROBS] = filled
    return count


def apply_rollout_correction(batch: DataProto, algorithm_config: Any) -> dict[str, float]:
    """verl's rollout correction on a batch holding `old_log_probs` (in place); returns its metrics."""
    if OLD_LOG_PROBS not in batch.batch:
        raise ValueError("rollout correction needs batch['old_log_probs']: compute the old log-probs first")
    if IS_WEIGHTS_KEY in batch.batch and ROW_WEIGHTS_KEY not in batch.batch:
        raise ValueError("apply the rollout correction before loss.apply_row_weights (it multiplies into its weights)")
    metrics: dict[str, float] = {}
    filled = fill_missing_rollout_log_probs(batch)
    if ROLLOUT_LOG_PROBS not in batch.batch:
        return metrics
    metrics["agl/data/rows_without_rollout_log_probs"] = float(filled)
    # What fit logs beside the old log-probs whenever rollout log-probs are there.
    metrics.update(calculate_debug_metrics(batch))
    config = algorithm_config.get("rollout_correction", None) if algorithm_config is not None else None
    if config is None:
        return metrics
    if config.get("bypass_mode", False):
        raise ValueError(
            "algorithm.rollout_correction.bypass_mode=true is not supported: it replaces the per_rollout_mean loss"
        )
    corrected, corr_metrics = compute_rollout_correction_and_add_to_batch(batch, config)
    if corrected is not batch:  # verl unions in place today; keep the caller's object authoritative anyway
        batch.batch, batch.non_tensor_batch, batch.meta_info = (
            corrected.batch,
            corrected.non_tensor_batch,
            corrected.meta_info,
        )
    metrics.update(corr_metrics)
    return metrics
