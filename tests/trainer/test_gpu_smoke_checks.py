"""tools/gpu_smoke.py's decisions, on CPU: its overrides compose into verl configs without graph capture or
compiling, and its PASS/FAIL checks accept a correct run (retention keeps the last steps' rollouts; a step skipped
for no learning signal has no actor metrics) and refuse a wrong one."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from verl.utils.config import omega_conf_to_dataclass

from services.trainer.config import CONFIG_DIR, CONFIG_NAME
from tools import gpu_smoke

pytestmark = pytest.mark.trainer


def test_the_smoke_runs_overrides_turn_off_graph_capture_and_compiling(tmp_path: Path) -> None:
    args = argparse.Namespace(data_dir=tmp_path, gpu_memory_utilization=0.3, steps=2)
    items = gpu_smoke.overrides(args, "smoke", "127.0.0.1:1", "", tmp_path / "model", tmp_path / "tasks.jsonl")
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        cfg = compose(config_name=CONFIG_NAME, overrides=items)
    resolved = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    rollout = omega_conf_to_dataclass(resolved.actor_rollout_ref.rollout)
    assert rollout.enforce_eager is True
    assert resolved.actor_rollout_ref.actor.use_torch_compile is False
    # What verl's actor engine reads (its fsdp_config interpolates the actor's key).
    assert resolved.actor_rollout_ref.actor.fsdp_config.use_torch_compile is False
    assert cfg.agl.retention.keep_steps == gpu_smoke.KEEP_STEPS


def test_the_step_check_accepts_a_step_skipped_for_no_signal_and_needs_one_update() -> None:
    updated, skipped = {"actor/pg_loss": 0.1}, {"agl/update/skipped_no_signal": 1.0}
    assert gpu_smoke.steps_trained_or_skipped({1: skipped, 2: updated}, 2)[0]
    assert not gpu_smoke.steps_trained_or_skipped({1: skipped, 2: skipped}, 2)[0]
    assert not gpu_smoke.steps_trained_or_skipped({1: updated, 2: {}}, 2)[0]


def test_the_retention_check_keeps_the_last_steps_rollouts_only() -> None:
    # Two steps of 16 rollouts with keep_steps 2: all 32 stay, which is correct.
    assert gpu_smoke.retention_kept([1] * 16 + [2] * 16, 2, 2)[0]
    assert not gpu_smoke.retention_kept([1] * 16 + [2] * 16 + [3] * 16, 3, 2)[0]
    assert gpu_smoke.retention_kept([], 2, 0)[0] and not gpu_smoke.retention_kept([2], 2, 0)[0]
    assert not gpu_smoke.retention_kept([None], 2, 2)[0]
