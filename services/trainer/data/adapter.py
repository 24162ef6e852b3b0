"""The data path in one call: finished rollouts -> a verl DataProto ready for the actor update.

traces -> rows (aggregation, limits) -> rollout-level advantages -> mini-batch alignment -> tensors ->
per-rollout loss weights. Every count (drops, truncations, breaks, alignment) comes back as a metric.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from verl import DataProto

from services.trainer.data.advantage import rollout_advantages, zero_variance_groups
from services.trainer.data.aggregation import Row, rows_from_trace
from services.trainer.data.alignment import align_rows
from services.trainer.data.batch import rows_to_dataproto
from services.trainer.data.loss import ROW_WEIGHTS_KEY, per_rollout_token_weights
from services.trainer.data.settings import DataPathSettings
from services.trainer.data.staleness import bound_staleness
from services.trainer.data.step_health import FLAGGED_COUNTS, RowFlags, StepHealth, row_health
from services.trainer.data.trace_stats import row_metrics
from services.trainer.data.triplets import OTHER_ROLE_CALLS, REWARD_MISSING, RolloutTrace


@dataclass
class TrainingBatch:
    data: DataProto | None
    metrics: dict[str, float]
    num_updates: int
    mini_batch_rows: int
    # The rows' health (services/trainer/data/step_health.py), with the rollouts behind each share.
    health: StepHealth | None = None
    # Every row built (before alignment) and each rollout's advantage: what data/row_records.py keeps for the console.
    rows: list[Row] = field(default_factory=list)
    advantages: dict[str, float] = field(default_factory=dict)


def build_rows(
    traces: Sequence[RolloutTrace], settings: DataPathSettings, counts: Counter[str], flags: RowFlags | None = None
) -> list[Row]:
    rows: list[Row] = []
    for trace in traces:
        before = {key: counts.get(key, 0) for key in FLAGGED_COUNTS} if flags is not None else {}
        rows.extend(
            rows_from_trace(
                trace,
                settings.level,
                max_prompt_length=settings.max_prompt_length,
                max_response_length=settings.max_response_length,
                counts=counts,
            )
        )
        if flags is not None:
            flags.note(trace.rollout_id, before, counts)
    return rows


def build_training_batch(
    traces: Sequence[RolloutTrace],
    settings: DataPathSettings,
    *,
    rng: random.Random | None = None,
    algo_config: Any = None,
    counts: Counter[str] | None = None,
    weights_version: int | None = None,
) -> TrainingBatch:
    """Runs the whole data path. `data` is None when no row survives (the step then has nothing to train).

    weights_version: the version of the weights this update starts from; given, each trained token's lag behind it
    is measured and settings.max_staleness applied (data/staleness.py)."""
    rng = rng or random.Random(0)
    counts = counts if counts is not None else Counter()
    flags = RowFlags()
    rows = build_rows(traces, settings, counts, flags)
    staleness: dict[str, float] = {}
    if weights_version is not None:
        bounded = bound_staleness(rows, weights_version, settings.max_staleness)
        rows, staleness = bounded.rows, bounded.metrics
    health = row_health(rows, counts, flags)
    advantages = rollout_advantages(
        rows,
        settings.adv_estimator,
        norm_adv_by_std_in_grpo=settings.norm_adv_by_std_in_grpo,
        algo_config=algo_config,
    )
    alignment = align_rows(
        [row.group_id for row in rows],
        zero_variance_groups(rows),
        mini_batch_rows=settings.mini_batch_rows,
        max_updates=settings.max_ppo_update_times,
        divisor=settings.row_divisor,
        rng=rng,
    )
    kept = [rows[i] for i in alignment.keep]
    metrics: dict[str, float] = {f"agl/data/{key}": float(value) for key, value in sorted(counts.items())}
    metrics.update(
        {
            "agl/data/rollouts": float(len(traces)),
            # Always present (a Counter key appears only when non-zero): a run whose agents never post a reward
            # trains on the fill value, and this is where that shows.
            "agl/data/reward_missing": float(counts.get(REWARD_MISSING, 0)),
            "agl/data/reward_filled_fraction": counts.get(REWARD_MISSING, 0) / max(len(traces), 1),
            # Calls the rollouts' role maps sent to another policy or a frozen one: recorded, never in a batch.
            "agl/data/other_role_calls": float(counts.get(OTHER_ROLE_CALLS, 0)),
            "agl/data/rows_built": float(len(rows)),
            "agl/data/rows_trained": float(len(kept)),
            "agl/align/dropped_zero_variance_rows": float(alignment.dropped_zero_variance_rows),
            "agl/align/dropped_random_rows": float(alignment.dropped_random_rows),
            "agl/align/num_updates": float(alignment.num_updates),
            "agl/align/mini_batch_rows": float(alignment.mini_batch_rows),
        }
    )
    metrics.update(row_metrics(rows, counts))
    metrics.update(staleness)
    if not kept:
        return TrainingBatch(None, metrics, 0, 0, health, rows, advantages)
    data = rows_to_dataproto(
        kept,
        advantages,
        prompt_length=settings.max_prompt_length,
        response_length=settings.max_response_length,
        pad_token_id=settings.pad_token_id,
    )
    data.batch[ROW_WEIGHTS_KEY] = per_rollout_token_weights(
        data.non_tensor_batch["rollout_id"], data.batch["response_mask"]
    )
    metrics["agl/data/rollouts_trained"] = float(len({row.rollout_id for row in kept}))
    metrics["agl/data/has_rollout_log_probs"] = float("rollout_log_probs" in data.batch)
    data.meta_info["agl_num_updates"] = alignment.num_updates
    data.meta_info["agl_mini_batch_rows"] = alignment.mini_batch_rows
    return TrainingBatch(data, metrics, alignment.num_updates, alignment.mini_batch_rows, health, rows, advantages)
