"""The data path's settings (data/adapter.py), apart from the data path itself: the trainer's config builds them on
the driver, which imports no verl (data/adapter.py does, through DataProto and verl's advantage estimators)."""

from __future__ import annotations

from dataclasses import dataclass

from services.trainer.data.aggregation import AggregationLevel


@dataclass(frozen=True)
class DataPathSettings:
    level: AggregationLevel = AggregationLevel.TRAJECTORY
    max_prompt_length: int = 1024
    max_response_length: int = 1024
    pad_token_id: int = 0
    adv_estimator: str = "grpo"
    norm_adv_by_std_in_grpo: bool = True
    # Rows per optimiser update (verl: ppo_mini_batch_size * rollout.n); <= 0: one update on all rows.
    mini_batch_rows: int = 0
    # Cap on optimiser updates per step; <= 0: no cap.
    max_ppo_update_times: int = 0
    # Rows must split evenly over this many data-parallel ranks.
    row_divisor: int = 1
    # Generated tokens more than this many weight versions behind the update are masked out of the loss
    # (data/staleness.py); None: no bound. Asynchronous training only.
    max_staleness: int | None = None
