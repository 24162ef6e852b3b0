"""What `agl train` starts from: the supervised examples of --sft-data (every shape read, every bad line named),
the learning rate by the model's size, and the pre-flight's judgement of sampled groups. Pure pieces; the whole
path (agl train --sft-data, the pre-flight against the real engine) is in test_train.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from services.cli.errors import CliError
from services.cli.train import learning_rate, preflight, sft


def write_lines(path: Path, *records: object) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def test_every_shape_of_example_is_read(tmp_path: Path) -> None:
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    transcript = [*chat, {"role": "assistant", "content": "4"}, {"role": "user", "content": "3+3?"}]
    transcript.append({"role": "assistant", "content": "6"})
    trajectory = {
        "step": 1,
        "kind": "train",
        "reward": 1.0,
        "calls": [{"prompt": "<|im_start|>user\nx", "response": "y"}],
    }
    path = write_lines(
        tmp_path / "sft.jsonl",
        {"messages": chat, "answer": "4"},
        {"messages": transcript},
        {"prompt": "5+5?", "answer": "10"},
        trajectory,
        {**trajectory, "reward": 0.5},  # not a success
        {**trajectory, "kind": "val"},  # a held-out score: its prompt is the request's messages, not the model's
        "",
    )
    examples = sft.load_examples(path)
    assert examples == [
        sft.Example(chat, "4"),
        sft.Example(transcript[:2], "4"),
        sft.Example(transcript[:4], "6"),
        sft.Example([{"role": "user", "content": "5+5?"}], "10"),
        sft.Example("<|im_start|>user\nx", "y"),
    ]
    assert "Be brief." in set(sft.example_strings(examples))


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("{not json", "line 2: not JSON"),
        ("[1, 2]", "line 2: a JSON object is wanted"),
        ('{"prompt": 5, "answer": "x"}', 'line 2: "prompt" and "answer" must both be strings'),
        ('{"messages": "hi"}', 'line 2: "messages" (a list of chat messages with a "role")'),
        ('{"messages": [{"role": "user", "content": "a"}], "answer": 3}', 'line 2: "answer" must be a string'),
    ],
)
def test_a_bad_line_is_one_error_naming_it(tmp_path: Path, line: str, says: str) -> None:
    path = write_lines(tmp_path / "sft.jsonl", {"prompt": "a", "answer": "b"}, line)
    with pytest.raises(CliError) as raised:
        sft.load_examples(path)
    assert str(raised.value).startswith(f"--sft-data {path} {says}"), raised.value
    assert "\n" not in str(raised.value)


def test_a_file_without_examples_is_refused(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "sft.jsonl", {"messages": [{"role": "user", "content": "a"}]})
    with pytest.raises(CliError, match="no example in it"):
        sft.load_examples(path)
    with pytest.raises(CliError, match="no such file"):
        sft.load_examples(tmp_path / "missing.jsonl")


def test_supervised_defaults_fit_the_model() -> None:
    assert sft.default_settings("tiny", 50, None, None) == sft.SupervisedSettings(300, 1e-3, 32)
    # A real model: three passes over the examples, a small rate.
    assert sft.default_settings("/models/qwen", 50, None, None) == sft.SupervisedSettings(5, 1e-5, 32)
    assert sft.default_settings("/models/qwen", 8, 40, 2e-5) == sft.SupervisedSettings(40, 2e-5, 8)


def test_the_learning_rate_follows_the_parameter_count(tmp_path: Path) -> None:
    save_file({"a": torch.zeros(1000, 500), "b": torch.zeros(500)}, str(tmp_path / "model.safetensors"))
    save_file({"c": torch.zeros(2, 250)}, str(tmp_path / "model-2.safetensors"))
    assert learning_rate.parameter_count(tmp_path) == 501_000
    assert learning_rate.parameter_count(tmp_path / "none") is None
    assert learning_rate.default_lr(1_000_000) == pytest.approx(1e-4)
    assert learning_rate.default_lr(500_000_000) == pytest.approx(4.47e-6, rel=1e-2)
    assert learning_rate.default_lr(7_000_000_000) == pytest.approx(1.2e-6, rel=1e-2)
    assert learning_rate.default_lr(10**12) == 1e-6  # held at the lowest
    assert learning_rate.default_lr(10_000) == 1e-4  # and the highest
    assert learning_rate.default_lr(None) == 1e-6  # an unknown size takes the safe side
    assert learning_rate.default_lr(500_000_000, lora=True) == pytest.approx(4.47e-5, rel=1e-2)
    assert learning_rate.default_lr(1_000_000, lora=True) == pytest.approx(1e-3)


def test_the_preflight_refuses_groups_whose_rewards_never_differ() -> None:
    same = [{"group": f"g{i // 4}", "reward": 0.0} for i in range(16)]
    found = preflight.judge(same, 4)
    assert (found.groups, found.mixed_groups) == (4, 0)
    refusal = found.refusal()
    assert refusal is not None and "every reward 0" in refusal and "--sft-data FILE" in refusal
    assert "--allow-no-learning" in refusal and "\n" not in refusal
    # Groups all right and groups all wrong: still nothing to learn from.
    split = [{"group": f"g{i // 4}", "reward": 1.0 if i < 8 else None} for i in range(16)]
    assert "each group's rewards equal" in (preflight.judge(split, 4).refusal() or "")
    mixed = [*same[:15], {"group": "g3", "reward": 1.0}]
    found = preflight.judge(mixed, 4)
    assert found.refusal() is None
    assert found.line() == "1 of 4 groups (4 tasks x 4 samples) with rewards that differ, mean reward 0.062"


def test_report_targets_are_parsed_checked_and_write_into_the_run_folder(tmp_path: Path) -> None:
    from services.cli.train import reporting

    assert reporting.parse_targets(["tensorboard", "wandb,tensorboard"]) == ("tensorboard", "wandb")
    with pytest.raises(CliError, match="--report-to 'comet': one of tensorboard, wandb, mlflow"):
        reporting.parse_targets(["comet"])
    assert reporting.trainer_loggers(("tensorboard",)) == "trainer.logger=[console,file,tensorboard]"
    env = reporting.trainer_environment(("tensorboard", "wandb", "mlflow"), tmp_path, {})
    assert env == {
        "TENSORBOARD_DIR": str(tmp_path / "tensorboard"),
        "WANDB_DIR": str(tmp_path),
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
    }
    assert reporting.trainer_environment(("tensorboard",), tmp_path, {"TENSORBOARD_DIR": "/tb"}) == {
        "TENSORBOARD_DIR": "/tb"
    }
    reporting.check_targets(("wandb",), {"WANDB_MODE": "offline"})
    reporting.check_targets(("wandb",), {"WANDB_API_KEY": "k"})
    home = tmp_path / "home"
    home.mkdir()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HOME", str(home))  # no ~/.netrc: never logged in
        with pytest.raises(CliError, match="WANDB_MODE=offline"):
            reporting.check_targets(("wandb",), {})


def test_an_interrupted_run_of_the_same_agent_and_data_is_named(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from services.cli.train.plan import unfinished_runs_like

    def run_file(run_id: str, **record: object) -> None:
        folder = tmp_path / run_id
        folder.mkdir()
        base = {"run_id": run_id, "agent_class": "a:A", "command": [], "data": "/d/tasks.jsonl", "state": "interrupted"}
        (folder / "run.json").write_text(json.dumps({**base, **record}))

    run_file("r1", step=3)
    run_file("r2", state="succeeded")
    run_file("r3", data="/d/other.jsonl")
    run_file("r4", agent_class="b:B")
    (tmp_path / "r5").mkdir()
    (tmp_path / "r5" / "run.json").write_text("{broken")
    plan = SimpleNamespace(agent_class="a:A", command=(), train_file=Path("/d/tasks.jsonl"))
    assert unfinished_runs_like(plan, tmp_path) == [("r1", 3)]  # type: ignore[arg-type]
