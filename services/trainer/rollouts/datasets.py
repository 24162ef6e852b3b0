"""Task datasets loaded into memory: JSONL (one JSON object per line) or parquet (one row per task).

The agent builds its own prompts, so nothing is tokenised here: each record is the rollout input as-is.
A record's `id` field (if any) is its data id; otherwise "<file name>:<line or row index>".
"""

from __future__ import annotations

import json
import logging
import os
import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from services.trainer.rollouts.specs import Sample

log = logging.getLogger(__name__)

# Where verl's checkpointing (RayPPOTrainer._save_checkpoint) keeps the train dataloader's state_dict.
DATALOADER_STATE_FILE = "data.pt"


def _records(path: Path) -> list[Any]:
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    if suffix in (".jsonl", ".json"):
        text = path.read_text()
        if suffix == ".json" and text.lstrip().startswith("["):
            return json.loads(text)
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    raise ValueError(f"dataset {path}: expected .jsonl, .json or .parquet")


def load_samples(paths: str | Sequence[str], max_samples: int = -1) -> list[Sample]:
    """Every record of the files, in order; at most max_samples when it is positive."""
    files = [paths] if isinstance(paths, str) else list(paths)
    samples: list[Sample] = []
    for name in files:
        path = Path(name).expanduser()
        for index, record in enumerate(_records(path)):
            data_id = record.get("id") if isinstance(record, dict) else None
            samples.append(Sample(str(data_id) if data_id is not None else f"{path.name}:{index}", record))
    if max_samples > 0:
        samples = samples[:max_samples]
    return samples


def sample_stream(samples: Sequence[Sample], *, shuffle: bool, seed: int, skip: int = 0) -> Iterator[Sample]:
    """Epoch after epoch (reshuffled with seed + epoch), skipping the first `skip` samples drawn."""
    if not samples:
        return
    epoch = 0
    drawn = 0
    while True:
        order = list(range(len(samples)))
        if shuffle:
            random.Random(seed + epoch).shuffle(order)
        for index in order:
            if drawn >= skip:
                yield samples[index]
            drawn += 1
        epoch += 1


def last_checkpoint(checkpoint_dir: str | Path) -> int:
    """The step of verl's latest whole checkpoint in the folder (its tracker file; 0: none)."""
    tracker = Path(str(checkpoint_dir)) / "latest_checkpointed_iteration.txt"
    try:
        return int(tracker.read_text().strip())
    except (OSError, ValueError):
        return 0


def checkpoint_folder(trainer_config: Any, global_steps: int) -> Path | None:
    """The folder verl's `_load_checkpoint` resumes from at `global_steps` (None: a fresh start), resolved as verl
    resolves it: `resume_from_path` in resume_path mode, else `default_local_dir/global_step_N`."""
    mode = trainer_config.get("resume_mode", "auto")
    if global_steps <= 0 or mode == "disable":
        return None
    if mode == "resume_path" and trainer_config.get("resume_from_path"):
        folder = Path(str(trainer_config.resume_from_path))
    else:
        folder = Path(str(trainer_config.default_local_dir)) / f"global_step_{global_steps}"
    return folder if folder.is_absolute() else Path(os.getcwd()) / folder


class TaskLoader:
    """Stands in for verl's train dataloader: steps per epoch, and a checkpointable draw position."""

    def __init__(self, samples: Sequence[Sample], batch_size: int, *, shuffle: bool, seed: int) -> None:
        self.samples = list(samples)
        self.batch_size = max(batch_size, 1)
        self.shuffle = shuffle
        self.seed = seed
        self.drawn = 0

    def __len__(self) -> int:
        return max(len(self.samples) // self.batch_size, 1)

    def state_dict(self) -> dict[str, int]:
        return {"drawn": self.drawn}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.drawn = int(state.get("drawn", 0))

    @staticmethod
    def resume_folder(trainer_config: Any) -> Path | None:
        """The checkpoint folder verl's `_load_checkpoint` will resume from, known before it runs (None: a fresh
        start): `resume_from_path`, else the latest whole one in `default_local_dir` (its tracker file)."""
        named = trainer_config.get("resume_mode") == "resume_path" and trainer_config.get("resume_from_path")
        # resume_path names its folder: the step only has to be past 0 (the folder's own step is verl's to read).
        step = 1 if named else last_checkpoint(trainer_config.default_local_dir)
        folder = checkpoint_folder(trainer_config, step)
        return folder if folder is not None and folder.is_dir() else None

    def checkpoint_state_path(self, trainer_config: Any, global_steps: int) -> Path | None:
        """The data.pt verl's `_load_checkpoint` resumed from at `global_steps` (None: a fresh start)."""
        folder = checkpoint_folder(trainer_config, global_steps)
        return folder / DATALOADER_STATE_FILE if folder is not None else None

    def resume(self, trainer_config: Any, global_steps: int) -> bool:
        """Restores the draw position saved with the checkpoint verl resumed from, epoch boundary included.

        verl 0.9.1 skips `load_state_dict` when the resumed step ends an epoch (its own loader would be
        exhausted); this loader's position is absolute (epoch order = seed + epoch), so skipping it would
        replay epoch 0. Call after `_load_checkpoint()` with `config.trainer` and the restored global step.
        Returns whether a saved position was loaded.
        """
        path = self.checkpoint_state_path(trainer_config, global_steps)
        if path is None or not path.exists():
            return False
        import torch

        state = torch.load(path, weights_only=True)
        self.load_state_dict(state)
        log.info("resumed the task order at sample %d (step %d, %s)", self.drawn, global_steps, path)
        return True

    def stream(self) -> Iterator[Sample]:
        """Samples from the current position on; every sample taken advances the saved position."""
        for sample in sample_stream(self.samples, shuffle=self.shuffle, seed=self.seed, skip=self.drawn):
            self.drawn += 1
            yield sample
