"""Task datasets loaded into memory: JSONL (one JSON object per line) or parquet (one row per task).

The agent builds its own prompts, so nothing is tokenised here: each record is the rollout input as-is.
A record's `id` field (if any) is its data id; otherwise "<file name>:<line or row index>".
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from .specs import Sample


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

    def stream(self) -> Iterator[Sample]:
        """Samples from the current position on; every sample taken advances the saved position."""
        for sample in sample_stream(self.samples, shuffle=self.shuffle, seed=self.seed, skip=self.drawn):
            self.drawn += 1
            yield sample
