"""TaskLoader resume through verl 0.9.1's own checkpoint code (`RayPPOTrainer._save_checkpoint` /
`_load_checkpoint`), at an epoch boundary too, where verl skips the loader's `load_state_dict`."""

from __future__ import annotations

import warnings
from itertools import islice
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from services.trainer.config import CONFIG_DIR, CONFIG_NAME
from services.trainer.rollouts.datasets import TaskLoader
from services.trainer.rollouts.specs import Sample

# Import-time warnings of verl's optional engines (torchtitan absent) and of ray's state API move.
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

pytestmark = pytest.mark.trainer

SAMPLES = [Sample(f"task-{i}", {"i": i}) for i in range(6)]
BATCH = 3  # 2 steps per epoch


class ActorGroupStandIn:
    """verl's actor worker group (GPU worker processes) as the checkpoint methods call it: records paths."""

    def __init__(self) -> None:
        self.saved: list[str] = []
        self.loaded: list[str] = []

    def save_checkpoint(self, local_path: str, remote_path: str | None, global_step: int, **_: object) -> None:
        self.saved.append(local_path)

    def load_checkpoint(self, local_path: str, del_local_after_load: bool = False) -> None:
        self.loaded.append(local_path)


def _config(tmp_path: Path, *overrides: str):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(config_name=CONFIG_NAME, overrides=[f"trainer.default_local_dir={tmp_path}/ckpt", *overrides])


def _trainer(config, loader: TaskLoader) -> RayPPOTrainer:
    """verl's trainer object with only what its checkpoint methods read (no Ray, no workers)."""
    trainer = RayPPOTrainer.__new__(RayPPOTrainer)
    trainer.config = config
    trainer.train_dataloader = loader
    trainer.actor_rollout_wg = ActorGroupStandIn()
    trainer.use_critic = False
    trainer.global_steps = 0
    return trainer


def _ids(stream, count: int) -> list[str]:
    return [s.data_id for s in islice(stream, count)]


def _run_and_save(tmp_path: Path, steps: int, *overrides: str):
    config = _config(tmp_path, *overrides)
    loader = TaskLoader(SAMPLES, BATCH, shuffle=True, seed=5)
    stream = loader.stream()
    _ids(stream, steps * BATCH)  # sync mode: each step draws one batch of tasks
    trainer = _trainer(config, loader)
    trainer.global_steps = steps
    trainer._save_checkpoint()
    return config, stream


@pytest.mark.parametrize("steps", [4, 3], ids=["epoch-boundary", "mid-epoch"])
def test_resume_continues_the_task_order(tmp_path: Path, steps: int) -> None:
    config, original = _run_and_save(tmp_path, steps)
    expected = _ids(original, 2 * BATCH)

    loader = TaskLoader(SAMPLES, BATCH, shuffle=True, seed=5)
    trainer = _trainer(config, loader)
    trainer._load_checkpoint()
    assert trainer.global_steps == steps
    assert trainer.actor_rollout_wg.loaded == [f"{tmp_path}/ckpt/global_step_{steps}/actor"]
    if steps % len(loader) == 0:
        # verl 0.9.1 leaves the loader untouched here: alone it would replay epoch 0's order.
        assert loader.drawn == 0
        assert _ids(TaskLoader(SAMPLES, BATCH, shuffle=True, seed=5).stream(), 2 * BATCH) != expected
    assert loader.resume(config.trainer, trainer.global_steps)
    assert loader.drawn == steps * BATCH
    assert _ids(loader.stream(), 2 * BATCH) == expected


def test_resume_from_a_named_checkpoint_and_fresh_starts(tmp_path: Path) -> None:
    config, original = _run_and_save(tmp_path, 4)
    expected = _ids(original, BATCH)
    named = _config(
        tmp_path, "trainer.resume_mode=resume_path", f"trainer.resume_from_path={tmp_path}/ckpt/global_step_4"
    )
    loader = TaskLoader(SAMPLES, BATCH, shuffle=True, seed=5)
    assert loader.checkpoint_state_path(named.trainer, 4) == tmp_path / "ckpt" / "global_step_4" / "data.pt"
    assert loader.resume(named.trainer, 4) and _ids(loader.stream(), BATCH) == expected
    # Step 0 (no checkpoint) and resume_mode=disable restore nothing.
    fresh = TaskLoader(SAMPLES, BATCH, shuffle=True, seed=5)
    assert not fresh.resume(config.trainer, 0) and fresh.drawn == 0
    assert not fresh.resume(_config(tmp_path, "trainer.resume_mode=disable").trainer, 4) and fresh.drawn == 0
