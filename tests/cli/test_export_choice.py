"""Which of a run's weights `agl export` and the end of `agl train` take, and what they say about it; and which
models `agl eval --baseline` can load into the model's engine. Run folders and model folders as the commands leave
them; the whole path (a trained run, its export, an eval against its base) is tests/cli/test_train.py's."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from services.cli.errors import CliError
from services.cli.train.checks import check_same_family
from services.cli.train.export import choose_weights, weight_files
from services.trainer.run.best import BestWeights

REWARD = "val/agl/reward_mean"


def run_folder(tmp_path: Path, validations: list[tuple[int, float]]) -> Path:
    run = tmp_path / "run"
    weights = run / "state" / "weights"
    weights.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"run_id": "r1", "base_model": str(tmp_path / "base")}))
    best = BestWeights(run / "best")
    for step, reward in validations:
        (weights / ".tmp").write_bytes(f"step {step}".encode())
        os.replace(weights / ".tmp", weights / "model.safetensors")
        best.record(step, {REWARD: reward}, files=[weights / "model.safetensors"])
    return run


def test_the_best_is_taken_by_default_and_the_line_names_step_reward_and_every_score(tmp_path: Path) -> None:
    run = run_folder(tmp_path, [(0, 0.25), (20, 0.5), (40, 0.375)])
    choice = choose_weights(run, None)
    assert choice.which == "best"
    assert choice.describe() == (
        "the weights of step 20, the best held-out reward (0.500) of 3 validations (by step: 0: 0.250, 20: 0.500, "
        "40: 0.375); the last step's: --weights last"
    )
    assert [p.read_bytes() for p in weight_files(run, "best")] == [b"step 20"]
    assert [p.read_bytes() for p in weight_files(run, "last")] == [b"step 40"]
    last = choose_weights(run, "last")
    assert last.which == "last" and "the best validation was step 20, held-out reward 0.500" in last.describe()


def test_a_run_without_validation_exports_its_last_and_refuses_best_by_name(tmp_path: Path) -> None:
    run = run_folder(tmp_path, [])
    choice = choose_weights(run, None)
    assert choice.which == "last" and "kept no best: it had no periodic validation" in choice.describe()
    with pytest.raises(CliError, match=r"--weights best: run run kept no best weights .* --val FILE and --val-every"):
        choose_weights(run, "best")


def model_dir(path: Path, **config: object) -> Path:
    path.mkdir(parents=True)
    base = {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 128, "torch_dtype": "float32"}
    (path / "config.json").write_text(json.dumps({**base, **config}))
    (path / "tokenizer.json").write_text('{"model": "bpe"}')
    (path / "chat_template.jinja").write_text("{{ messages }}")
    (path / "model.safetensors").write_bytes(b"")
    return path


def test_a_baseline_must_share_the_models_architecture_and_tokenizer(tmp_path: Path) -> None:
    model = model_dir(tmp_path / "model")
    check_same_family(model, model_dir(tmp_path / "bf16", torch_dtype="bfloat16"))  # dtype aside: the same
    with pytest.raises(CliError, match=r"config\.json's hidden_size is 256, the model's 128"):
        check_same_family(model, model_dir(tmp_path / "wider", hidden_size=256))
    other = model_dir(tmp_path / "other")
    (other / "tokenizer.json").write_text('{"model": "unigram"}')
    with pytest.raises(CliError, match=r"its tokenizer\.json differs from the model's"):
        check_same_family(model, other)
    templated = model_dir(tmp_path / "templated")
    (templated / "chat_template.jinja").write_text("{{ other }}")
    with pytest.raises(CliError, match=r"chat_template\.jinja differs"):
        check_same_family(model, templated)
    binary = model_dir(tmp_path / "binary")
    (binary / "model.safetensors").unlink()
    with pytest.raises(CliError, match=r"no \*\.safetensors weights"):
        check_same_family(model, binary)


def test_agl_train_keeps_the_best_only_where_it_validates_and_the_user_left_validation_alone() -> None:
    from types import SimpleNamespace

    from services.cli.train.trainer_args import keeps_best

    plan = SimpleNamespace(val_every=10, val_file=Path("val.jsonl"), extra_overrides=[], overrides=[])
    assert keeps_best(plan)
    assert not keeps_best(SimpleNamespace(**{**vars(plan), "val_every": 0}))
    assert not keeps_best(SimpleNamespace(**{**vars(plan), "val_file": None}))
    # The user's own Hydra override of the validation: agl.best_dir would be refused by the trainer without it.
    assert not keeps_best(SimpleNamespace(**{**vars(plan), "overrides": ["trainer.test_freq=-1"]}))
    assert not keeps_best(SimpleNamespace(**{**vars(plan), "overrides": ["+data.val_files=other.jsonl"]}))
