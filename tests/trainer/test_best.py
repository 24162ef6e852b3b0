"""The best validated weights kept beside the last (services/trainer/run/best.py), as the trainer drives it: a weights
file replaced after every update, validations that rise, tie and fall, a resume that does later steps again."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from services.trainer.run.best import ADAPTER, RECORD, BestWeights, read_best

REWARD = "val/agl/reward_mean"


def push(weights: Path, content: bytes) -> Path:
    """What the actor does after an update: the file is written aside and renamed into place."""
    weights.mkdir(parents=True, exist_ok=True)
    partial = weights / ".model.safetensors.1.tmp"
    partial.write_bytes(content)
    os.replace(partial, weights / "model.safetensors")
    return weights / "model.safetensors"


def test_the_highest_reward_is_kept_and_a_tie_keeps_the_earlier_step(tmp_path: Path) -> None:
    weights, folder = tmp_path / "weights", tmp_path / "best"
    best = BestWeights(folder)
    for step, reward in [(0, 0.25), (20, 0.5), (40, 0.5), (60, 0.375)]:
        file = push(weights, f"step {step}".encode())
        kept = best.record(step, {REWARD: reward, "val/other": 1.0}, files=[file])
        assert kept == (step in (0, 20)), step
    # The weights of step 20, although the file was replaced twice since (a hard link holds the old contents).
    assert (folder / "model.safetensors").read_bytes() == b"step 20"
    record = read_best(folder)
    assert record is not None and (record.step, record.reward) == (20, 0.5)
    assert record.validations == ((0, 0.25), (20, 0.5), (40, 0.5), (60, 0.375))
    assert json.loads((folder / RECORD).read_text())["metric"] == REWARD
    # A new keeper over the same folder (a restarted trainer) knows the kept best.
    assert BestWeights(folder).is_better({REWARD: 0.5}) is False
    assert BestWeights(folder).is_better({REWARD: 0.51}) is True


def test_a_validation_without_the_held_out_reward_changes_nothing(tmp_path: Path) -> None:
    best = BestWeights(tmp_path / "best")
    assert best.record(3, {"val/agl/calls/count": 4.0}, files=[push(tmp_path / "w", b"x")]) is False
    assert not (tmp_path / "best").exists() and best.best is None


def test_a_new_best_with_no_weights_to_keep_is_an_error_not_a_claim(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no weights to keep"):
        BestWeights(tmp_path / "best").record(5, {REWARD: 0.3})
    assert not (tmp_path / "best").exists()


def test_a_lora_runs_adapter_directory_is_kept(tmp_path: Path) -> None:
    adapter = tmp_path / "weights" / "adapter-v4"
    adapter.mkdir(parents=True)
    (adapter / "adapter_model.safetensors").write_bytes(b"lora 4")
    (adapter / "adapter_config.json").write_text('{"r": 8}')
    BestWeights(tmp_path / "best").record(4, {REWARD: 0.4}, adapter=adapter)
    kept = tmp_path / "best" / ADAPTER
    assert sorted(p.name for p in kept.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    assert (kept / "adapter_model.safetensors").read_bytes() == b"lora 4"


def test_a_resume_drops_a_best_from_the_steps_it_does_again_and_keeps_an_earlier_one(tmp_path: Path) -> None:
    folder = tmp_path / "best"
    best = BestWeights(folder)
    best.record(0, {REWARD: 0.2}, files=[push(tmp_path / "w", b"zero")])
    best.record(10, {REWARD: 0.1}, files=[push(tmp_path / "w", b"ten")])
    assert best.forget_after(5) is False  # the best (step 0) is before the resume point; step 10's figure goes
    assert read_best(folder) is not None and read_best(folder).validations == ((0, 0.2),)
    best.record(10, {REWARD: 0.3}, files=[push(tmp_path / "w", b"ten again")])
    assert best.forget_after(5) is True  # the best is step 10's: done again, its weights no longer the run's
    assert not folder.exists() and best.best is None
    # The resumed run's first validation (the checkpoint's step, before training) starts the record again.
    assert best.record(5, {REWARD: 0.15}, files=[push(tmp_path / "w", b"five")]) is True
    assert (folder / "model.safetensors").read_bytes() == b"five"


def test_the_same_step_validated_twice_keeps_the_newer_figure(tmp_path: Path) -> None:
    best = BestWeights(tmp_path / "best")
    best.record(0, {REWARD: 0.2}, files=[push(tmp_path / "w", b"zero")])
    best.record(0, {REWARD: 0.2}, files=[push(tmp_path / "w", b"zero")])
    assert best.best is not None and best.best.validations == ((0, 0.2),)
