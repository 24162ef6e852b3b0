"""The rows a step hands verl split into verl's fixed micro-batches (colocated placement, use_dynamic_bsz false).

verl asserts `rows % micro_batch_size_per_gpu == 0` in prepare_micro_batches, for the old log-probs over the whole
batch and for each update's mini-batch. AGL's row count depends on the agents (a failed call, a break): 4 tasks x 4
rollouts with one call lost is 15 rows. The settings come from the composed config (gpu_smoke's sizes), the batch
from AGL's data path, the split from verl 0.9.1's own prepare_micro_batches.
"""

from __future__ import annotations

import random
import warnings
from collections import Counter

import pytest
from hydra import compose, initialize_config_dir
from verl.utils import tensordict_utils as tu
from verl.workers.utils.padding import left_right_2_no_padding

from services.trainer.config import CONFIG_DIR, CONFIG_NAME, settings_from_config
from services.trainer.data.adapter import build_training_batch
from services.trainer.data.triplets import trace_from_events

from .events import call, reward

with warnings.catch_warnings():
    # verl's engine package warns at import about optional engines (torchtitan); the suite makes warnings errors.
    warnings.simplefilter("ignore")
    from verl.workers.engine.utils import prepare_micro_batches

pytestmark = pytest.mark.trainer

RUNNABLE = ("agl.launch.agent_class=examples.math_agent.agent:MathAgent", "data.train_files=/srv/tasks.jsonl")
# tools/gpu_smoke.py's batch: 4 tasks x 4 rollouts, one mini-batch of 4 tasks.
SMOKE = ("data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4", "data.max_prompt_length=8",
         "actor_rollout_ref.rollout.response_length=8")  # fmt: skip


def _compose(*overrides: str):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(config_name=CONFIG_NAME, overrides=[*RUNNABLE, *SMOKE, *overrides])


def _traces(rollouts: int, lost: int) -> list:
    """`rollouts` one-call rollouts in groups of 4 with different rewards; the last `lost` made no call."""
    traces = []
    for i in range(rollouts):
        events = [reward(float(i % 2))] if i >= rollouts - lost else [call([1, 2], [3, 4], [-0.1, -0.2]), reward(i % 2)]
        traces.append(
            trace_from_events(f"r{i}", f"g{i // 4}", f"d{i // 4}", events, reward_fillna_value=0.0, counts=Counter())
        )
    return traces


def _split_as_verl(data, micro_batch_size_per_gpu: int) -> int:
    td = left_right_2_no_padding(data.to_tensordict())
    tu.assign_non_tensor(td, use_dynamic_bsz=False, micro_batch_size_per_gpu=micro_batch_size_per_gpu)
    micro_batches, _ = prepare_micro_batches(td)
    return len(micro_batches)


@pytest.mark.parametrize("lost", [0, 1, 3])
def test_every_step_splits_into_verls_fixed_micro_batches(lost: int) -> None:
    cfg = _compose()
    assert cfg.actor_rollout_ref.actor.use_dynamic_bsz is False
    settings = settings_from_config(cfg)
    prepared = build_training_batch(_traces(16, lost), settings.data_path, rng=random.Random(0))
    assert prepared.data is not None
    rows = len(prepared.data)
    assert rows >= 8 and rows == prepared.num_updates * prepared.mini_batch_rows
    # Old log-probs over the whole batch, then each update's mini-batch (one GPU: the rank holds them all).
    log_prob_micro = int(cfg.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu)
    assert _split_as_verl(prepared.data, log_prob_micro) == rows // log_prob_micro
    update_micro = int(cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu)
    mini = prepared.data[: prepared.mini_batch_rows]
    assert _split_as_verl(mini, update_micro) == prepared.mini_batch_rows // update_micro


def test_the_divisor_is_the_data_parallel_size_with_dynamic_micro_batches() -> None:
    assert settings_from_config(_compose("trainer.n_gpus_per_node=2")).data_path.row_divisor == 16
    dynamic = _compose("trainer.n_gpus_per_node=2", "placement=cpu")
    assert settings_from_config(dynamic).data_path.row_divisor == 2
