"""`agl train --judge`: the options checked in one line each, and what they become in the trainer's config (the
trainer's own reading of agl.judge). The judge at work is in tests/trainer/test_judge.py."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from services.cli.errors import USAGE, CliError
from services.cli.train import collect
from services.cli.train.plan import JudgePlan, judge_settings
from services.trainer.config import CONFIG_DIR, CONFIG_NAME
from services.trainer.config import judge_settings as trainer_judge_settings

CHECKOUT = Path(__file__).resolve().parents[2]


def args(tmp_path: Path, **given: object) -> argparse.Namespace:
    values = {"judge": None, "judge_url": None, "judge_model": None, "judge_key_env": None, "judge_scope": None}
    values.update(given)
    namespace = argparse.Namespace(**values)
    namespace.given = {name for name, value in given.items() if value is not None}
    return namespace


def test_an_option_of_the_judge_without_the_judge_is_refused_in_one_line_by_the_command(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(CHECKOUT)}
    argv = [sys.executable, "-m", "services.cli", "train", "--data", "tasks.jsonl", "--agent-class", "a:B"]
    proc = subprocess.run(
        [*argv, "--judge-url", "http://127.0.0.1:9/v1"], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert proc.returncode == USAGE
    assert proc.stderr.splitlines() == ["agl: --judge-url applies to a judge: give --judge RUBRIC_FILE"], proc.stderr


def test_judge_combinations_that_cannot_work_are_refused_naming_the_option(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rubric = tmp_path / "rubric.md"
    rubric.write_text("Prefer the shorter correct answer.\n")
    (tmp_path / "blank.md").write_text("\n")
    monkeypatch.setenv("MY_JUDGE_KEY", "sk-1")
    monkeypatch.delenv("NOT_SET_KEY", raising=False)
    url = "https://judge.example/v1"
    refused = {
        "--judge-model applies to a judge: give --judge RUBRIC_FILE": {"judge_model": "m"},
        "--judge-scope applies to a judge": {"judge_scope": "all"},
        f"--judge {tmp_path / 'none.md'}: no such file": {"judge": tmp_path / "none.md"},
        f"--judge {tmp_path / 'blank.md'}: the rubric file is empty": {"judge": tmp_path / "blank.md"},
        "--judge-model applies to an external judge: give --judge-url URL too": {"judge": rubric, "judge_model": "m"},
        "--judge-key-env applies to an external judge": {"judge": rubric, "judge_key_env": "MY_JUDGE_KEY"},
        "--judge-url needs --judge-model NAME": {"judge": rubric, "judge_url": url},
        "--judge-url judge.example: an http:// or https:// base URL": {
            "judge": rubric, "judge_url": "judge.example", "judge_model": "m"
        },
        "--judge-key-env NOT_SET_KEY: the environment has no NOT_SET_KEY": {
            "judge": rubric, "judge_url": url, "judge_model": "m", "judge_key_env": "NOT_SET_KEY"
        },
        "--judge-key-env 'my key': the name of an environment variable": {
            "judge": rubric, "judge_url": url, "judge_model": "m", "judge_key_env": "my key"
        },
    }  # fmt: skip
    for says, given in refused.items():
        with pytest.raises(CliError) as err:
            judge_settings(args(tmp_path, **given))
        assert err.value.code == USAGE and str(err.value).startswith(says), (says, str(err.value))
    assert judge_settings(args(tmp_path)) is None
    plan = judge_settings(
        args(tmp_path, judge=rubric, judge_url=url, judge_model="m", judge_key_env="MY_JUDGE_KEY", judge_scope="all")
    )
    assert plan == JudgePlan(rubric.resolve(), url, "m", "MY_JUDGE_KEY", "all")


def test_the_judge_options_reach_the_trainers_agl_judge_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rubric = tmp_path / "my rubric.md"
    rubric.write_text("Prefer the capital.\n")
    monkeypatch.setenv("MY_JUDGE_KEY", "sk-1")
    external = JudgePlan(rubric, "http://127.0.0.1:8000/v1", "judge=large:7b", "MY_JUDGE_KEY", "all")
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        cfg = compose(config_name=CONFIG_NAME, overrides=external.overrides())
        policy = compose(config_name=CONFIG_NAME, overrides=JudgePlan(rubric).overrides())
        off = compose(config_name=CONFIG_NAME)
    found = trainer_judge_settings(cfg.agl, "run1", tmp_path)
    assert found is not None
    assert (found.rubric, found.base_url, found.model, found.api_key, found.scope) == (
        "Prefer the capital.\n", "http://127.0.0.1:8000/v1", "judge=large:7b", "sk-1", "all"
    )  # fmt: skip
    mine = trainer_judge_settings(policy.agl, "run1", None)
    assert mine is not None and mine.base_url is None and mine.scope == "missing" and mine.cache_path is None
    assert trainer_judge_settings(off.agl, "run1", tmp_path) is None


def test_with_a_judge_the_smoke_rollout_needs_no_reward_but_must_still_succeed(tmp_path: Path) -> None:
    log = tmp_path / "agent.log"
    call = {"http_status": 200}
    unrewarded = {"rollout_id": "r1", "state": "succeeded", "reward": None, "error": "", "calls": [call]}
    assert "succeeded WITHOUT A REWARD" in str(collect.rollout_problem(unrewarded, log))
    assert collect.rollout_problem(unrewarded, log, reward_required=False) is None
    crashed = {**unrewarded, "state": "failed", "error": "exit code 1"}
    assert "r1: failed: exit code 1" in str(collect.rollout_problem(crashed, log, reward_required=False))
    silent = {**unrewarded, "calls": []}
    assert "made no model call" in str(collect.rollout_problem(silent, log, reward_required=False))
