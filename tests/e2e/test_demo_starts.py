"""Each demo's warm start, built as a fresh clone builds it (`make demo ... --start-only`: the demo's own recipe,
empty caches), must be a start GRPO can learn from: the starting-point rules of services/engine/start_quality.py
hold and its measured figures are kept in the model folder. A deliberately broken start is refused in one line.

The calc start is the one that once stopped learning unnoticed (issue 48: a recipe on the edge of the point
where the tiny model learns to copy operands, held-out 0.00 on some machines); the math start's rules are
checked by the demo's training test (test_demo.py), which builds it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from services.engine.start_quality import recorded

REPO_ROOT = Path(__file__).resolve().parents[2]
START_LINE = re.compile(
    r"model: start held-out accuracy (?P<accuracy>[\d.]+)(, tool-call rate (?P<calls>[\d.]+))?, "
    r"mixed-reward groups (?P<mixed>[\d.]+) of (?P<groups>\d+)"
)


def demo(tmp_path: Path, *argv: str, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("AGL_") and key != "ENGINE_URL"}
    command = [sys.executable, "tools/demo.py", *argv, "--data-dir", str(tmp_path / "data")]
    command += ["--output-dir", str(tmp_path / "out")]
    return subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.timeout(1500)
def test_the_calc_demos_start_can_learn(tmp_path: Path) -> None:
    result = demo(tmp_path, "--agent", "calc", "--start-only", timeout=1450)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    found = START_LINE.search(result.stdout)
    assert found, result.stdout
    # The warm start stops once right on 20-45% of a probe of training tasks (docs/getting-started/demo.md): on the
    # held-out products that was 0.125-0.69 in the runs on record, a call on every greedy first turn, and groups
    # with mixed rewards for GRPO (0.09-0.39); the broken start of issue 48 had 0.00 and 0.00.
    assert float(found["accuracy"]) >= 0.05, found[0]
    assert float(found["calls"]) >= 0.9, found[0]
    assert float(found["mixed"]) >= 0.05, found[0]
    (model,) = (tmp_path / "data" / "models").glob("tiny-calc-*")
    quality = recorded(model)
    assert quality is not None and quality.groups == int(found["groups"]) == 64
    assert quality.held_out_tasks == 64
    assert not (tmp_path / "out" / "run.json").exists(), "--start-only trained"


@pytest.mark.timeout(900)
def test_a_broken_warm_start_is_refused_in_one_line_kept_measured_and_remeasured_when_its_figures_are_lost(
    tmp_path: Path,
) -> None:
    both = demo(tmp_path, "--warm-start-steps", "10", "--any-start", "--start-only", timeout=60)
    assert both.returncode == 1, both.stdout + both.stderr
    assert "--any-start lets a refused start train; --start-only trains nothing" in both.stderr
    assert not (tmp_path / "data" / "models").exists(), "a refused command built a model"

    result = demo(tmp_path, "--warm-start-steps", "10", "--start-only", timeout=550)
    assert result.returncode == 1, result.stdout + result.stderr
    (line,) = result.stderr.strip().splitlines()
    # A start that learned nothing: never right greedily, or (by chance) right in a group or two of 64.
    assert re.fullmatch(
        r"the warm start tiny-math-\w+ cannot learn: (mixed-reward groups 0\.0[0-4]\d \(64 tasks x 4 samples\) "
        r"under the minimum 0\.050: GRPO has no group to learn from|held-out accuracy 0\.0[01]\d \(64 tasks\) under "
        r"the minimum 0\.020: the start is never right) \(more --warm-start-steps; --any-start trains anyway\)",
        line,
    ), line
    assert "console:" not in result.stdout, "the stack started for a refused start"
    assert "model: warm start: step 10/10, loss " in result.stdout  # progress, a line per tenth of the steps
    # The figures stay with the model: a second run refuses at once, without building or measuring again.
    (model,) = (tmp_path / "data" / "models").glob("tiny-math-*")
    assert recorded(model) is not None
    again = demo(tmp_path, "--warm-start-steps", "10", "--start-only", timeout=120)
    assert again.returncode == 1 and "(cached)" in again.stdout
    assert again.stderr.strip() == line

    # A folder from an older recipe, measured never, is built (and measured) again rather than used.
    recipe_file = model / "agl_tiny_model.json"
    recipe = json.loads(recipe_file.read_text())
    del recipe["start_quality"]
    recipe_file.write_text(json.dumps(recipe))
    rebuilt = demo(tmp_path, "--warm-start-steps", "10", "--start-only", timeout=550)
    assert "(cached)" not in rebuilt.stdout and "warm-starting a tiny model" in rebuilt.stdout, rebuilt.stdout
    assert rebuilt.returncode == 1 and rebuilt.stderr.strip().startswith("the warm start tiny-math-")
    assert recorded(model) is not None
