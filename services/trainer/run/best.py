"""The run's best validated weights, kept beside its last ones: RL on a small validation set often peaks before
the last step, and the model a user wants is the one that scored best, not the one that happened to be trained last.

After each validation the trainer asks `BestWeights.consider` whether the held-out reward (`val/agl/reward_mean`)
beat every earlier one of the run; if so it hands over the files that hold the weights validated (the pushed
weights file, a LoRA adapter's directory, or a checkpoint's Hugging Face files), which are hard-linked (copied
across file systems) into `<folder>/` with `best.json` naming the step and the reward. The folder is replaced whole,
so a reader sees the previous best or the new one. A tie keeps the earlier step: fewer updates for the same score.

A run resumed from the checkpoint of step k does the steps after k again: a best from those steps is dropped with
them (`forget_after`), its reward no longer one of the run's, and the first validation of the resumed run (step k,
before training) is measured again.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.atomic_files import replace_dir

log = logging.getLogger(__name__)

METRIC = "val/agl/reward_mean"
RECORD = "best.json"
ADAPTER = "adapter"


@dataclass(frozen=True)
class Best:
    step: int
    reward: float
    # Every validation of the run so far, (step, reward), in the order they ran.
    validations: tuple[tuple[int, float], ...]


def read_best(folder: Path) -> Best | None:
    """The kept best of a run's best folder, or None (no validation yet, or a folder from before this record)."""
    try:
        record = json.loads((folder / RECORD).read_text())
        return Best(
            step=int(record["step"]),
            reward=float(record["reward"]),
            validations=tuple((int(s), float(r)) for s, r in record["validations"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _record_text(best: Best) -> str:
    record = {
        "metric": METRIC,
        "step": best.step,
        "reward": best.reward,
        "validations": [list(v) for v in best.validations],
    }
    return json.dumps(record, indent=2) + "\n"


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:  # another file system, or one without hard links
        shutil.copy2(source, target)


def _write_folder(folder: Path, best: Best, files: Sequence[Path], adapter: Path | None) -> None:
    partial = folder.with_name(f".{folder.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for source in files:
        _link_or_copy(source, partial / source.name)
    if adapter is not None:
        (partial / ADAPTER).mkdir()
        for source in sorted(p for p in adapter.iterdir() if p.is_file()):
            _link_or_copy(source, partial / ADAPTER / source.name)
    (partial / RECORD).write_text(_record_text(best))
    replace_dir(partial, folder)


class BestWeights:
    """The best-so-far record of one run and the folder that holds its weights."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.best = read_best(folder)

    def is_better(self, metrics: Mapping[str, Any]) -> bool:
        """Whether this validation's held-out reward beats the kept best (a validation without one never does)."""
        value = metrics.get(METRIC)
        if value is None:
            return False
        return self.best is None or float(value) > self.best.reward

    def record(
        self, step: int, metrics: Mapping[str, Any], *, files: Sequence[Path] = (), adapter: Path | None = None
    ) -> bool:
        """Notes this validation; keeps `files` (and the adapter directory) as the best when it beats the kept
        one. True when it did. A better validation with nothing to keep is an error: it would claim weights it
        does not have."""
        value = metrics.get(METRIC)
        if value is None:
            return False
        # A resumed run validates its checkpoint's step again: the newer figure replaces the older.
        earlier = tuple(v for v in self.best.validations if v[0] != step) if self.best else ()
        validations = (*earlier, (step, float(value)))
        if not self.is_better(metrics):
            assert self.best is not None
            self.best = Best(self.best.step, self.best.reward, validations)
            self._write_record()
            return False
        if not files and adapter is None:
            raise ValueError(f"step {step}: a new best held-out reward with no weights to keep")
        self.best = Best(step, float(value), validations)
        _write_folder(self.folder, self.best, files, adapter)
        log.info("step %d: best held-out reward so far (%.4f), its weights kept in %s", step, value, self.folder)
        return True

    def _write_record(self) -> None:
        """Only the record changes (the weights stay): a whole-file replace of best.json."""
        assert self.best is not None
        partial = self.folder / f".{RECORD}.partial"
        partial.write_text(_record_text(self.best))
        os.replace(partial, self.folder / RECORD)

    def forget_after(self, step: int) -> bool:
        """Drops what the steps after `step` said (they are done again); True when that was the kept best."""
        if self.best is None:
            return False
        kept = tuple(v for v in self.best.validations if v[0] <= step)
        if self.best.step <= step:
            if kept != self.best.validations:
                self.best = Best(self.best.step, self.best.reward, kept)
                self._write_record()
            return False
        shutil.rmtree(self.folder, ignore_errors=True)
        self.best = None
        log.info("best weights of a step after %d dropped: the resumed run does those steps again", step)
        return True
