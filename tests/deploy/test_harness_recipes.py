"""The harness recipes' own parts (examples/harnesses): a recipe started outside a rollout, or without its CLI, says
so in one line and exits 2; the check reads `answer.txt` before the final message. Their runs through the whole stack
are tests/e2e/test_harnesses.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from examples.harnesses import check
from examples.harnesses.harness_rollout import SETUP_EXIT

REPO = Path(__file__).resolve().parents[2]
ROLLOUT_ENV = {"AGL_OPENAI_BASE_URL": "http://127.0.0.1:9/v1", "AGL_EVENT_URL": "http://127.0.0.1:9/e"}


def recipe(module: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {key: value for key, value in os.environ.items() if not key.startswith(("AGL_", "HARNESS_"))}
    argv = [sys.executable, "-m", f"examples.harnesses.{module}"]
    return subprocess.run(argv, cwd=REPO, env={**base, **env}, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("module", ["claude_code", "codex", "qwen_code", "mini_swe_agent"])
def test_outside_a_rollout_the_recipe_names_what_is_missing(module: str) -> None:
    result = recipe(module, {"AGL_EVENT_URL": "http://127.0.0.1:9/e"})
    assert result.returncode == SETUP_EXIT, result.stdout + result.stderr
    [line] = result.stdout.splitlines()
    assert "AGL_OPENAI_BASE_URL, AGL_TASK_QUESTION not set" in line and "--env-map AGL_TASK_QUESTION=" in line


def test_a_cli_that_is_not_there_is_one_line(tmp_path: Path) -> None:
    env = {**ROLLOUT_ENV, "AGL_TASK_QUESTION": "What is 6 * 7?", "HARNESS_BIN": str(tmp_path / "claude")}
    result = recipe("claude_code", env)
    assert result.returncode == SETUP_EXIT
    assert result.stdout.strip() == f"claude-code: HARNESS_BIN={tmp_path / 'claude'} is not an executable file"


def test_the_check_reads_answer_txt_before_the_final_message(tmp_path: Path) -> None:
    assert check.score(tmp_path, "I think it is 41, no: 42.", "42") == (1.0, "final message: 42 is right")
    assert check.score(tmp_path, "The answer is 41.", "42") == (0.0, "final message: 41, expected 42")
    (tmp_path / "answer.txt").write_text("42\n")
    assert check.score(tmp_path, "The answer is 41.", "42") == (1.0, "answer.txt: 42 is right")
    assert check.score(tmp_path, "42", "")[0] == 0.0  # no answer in the task: nothing to be right about
