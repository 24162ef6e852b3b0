"""tools/demo_check.py's reading of a demo run (its metrics file and output) and its verdict; the runs themselves
are `make demo-check`'s (an hour: the figures go in the notes of changes that can stop a demo learning)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tools.demo_check import Outcome, held_out_accuracy, row, warm_start_seconds

CHECKOUT = Path(__file__).resolve().parents[2]


def test_held_out_accuracy_is_read_from_every_validation_of_the_metrics_file(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    steps = [(0, {"val/agl/reward_mean": 0.25}), (1, {"critic/score/mean": 0.3}), (20, {"val/agl/reward_mean": 0.5})]
    metrics.write_text("".join(json.dumps({"step": s, "data": d}) + "\n" for s, d in steps))
    assert held_out_accuracy(metrics) == [(0, 0.25), (20, 0.5)]
    assert held_out_accuracy(tmp_path / "none.jsonl") == []
    assert warm_start_seconds("model: warm start...\nmodel: /x/data/models/tiny-math-504d in 65s\n") == 65.0


def test_a_run_learns_only_with_exit_0_and_the_rise_reached() -> None:
    def outcome(code: int, accuracy: list[tuple[int, float]]) -> Outcome:
        return Outcome("calc", 2, code, accuracy, 218.0, 809.0, "16.56 14.19 9.22")

    learned = outcome(0, [(0, 0.125), (20, 0.17), (40, 0.30), (60, 0.30)])
    assert learned.failure(0.15) is None
    columns = "calc 2 0.125 0.300 0.300 +0.175 218 809 16.56 14.19 9.22 learns"
    assert row(learned, 0.15).split() == columns.split(" ")
    assert outcome(0, [(0, 0.25), (60, 0.375)]).failure(0.15) == "held-out accuracy rose +0.125, under +0.150"
    assert outcome(1, [(0, 0.25), (60, 0.5)]).failure(0.15) == "make demo exited 1"
    assert outcome(0, [(0, 0.25)]).failure(0.15) == "fewer than two validations in metrics.jsonl"


def test_unknown_demos_are_refused_before_anything_runs() -> None:
    done = subprocess.run(
        [sys.executable, "tools/demo_check.py", "--demos", "math,chess"], cwd=CHECKOUT, capture_output=True, text=True
    )
    assert done.returncode == 2 and "--demos: unknown ['chess']" in done.stderr, done.stderr
