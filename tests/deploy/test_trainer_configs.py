"""examples/*/train.yaml: Hydra config group options that compose over the trainer's config into settings the
trainer accepts, with a launch config the controller can run against every item of the dataset."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.controller.core.agent_env import parse_input, resolve_env_map
from tests.deploy.conftest import REPO_ROOT

pytestmark = pytest.mark.trainer

EXAMPLES = REPO_ROOT / "examples"


def _settings(monkeypatch: pytest.MonkeyPatch, agent: str, *overrides: str):
    from hydra import compose, initialize_config_dir

    from services.trainer.config import CONFIG_DIR, CONFIG_NAME, settings_from_config

    monkeypatch.chdir(REPO_ROOT)  # dataset paths are relative to the job's working directory
    for name in ("AGL_RUN_ID", "AGL_LEDGER_ADDR", "AGL_KEY", "AGL_MODEL_NAME"):
        monkeypatch.delenv(name, raising=False)
    # What `agl-trainer --config-dir examples +<agent>=train` composes.
    search = f"hydra.searchpath=[pkg://verl.trainer.config,file://{EXAMPLES}]"
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        cfg = compose(config_name=CONFIG_NAME, overrides=[search, f"+{agent}=train", *overrides])
    return cfg, settings_from_config(cfg)


@pytest.mark.parametrize(
    ("agent", "agent_class", "level"),
    [
        ("math_agent", "examples.math_agent.agent:MathAgent", "transition"),
        ("calc_agent", "examples.calc_agent.agent:CalcAgent", "trajectory"),
    ],
)
def test_example_config_composes_into_valid_trainer_settings(
    monkeypatch: pytest.MonkeyPatch, agent: str, agent_class: str, level: str
) -> None:
    from services.trainer.rollouts.datasets import load_samples
    from services.trainer.rollouts.specs import LaunchSettings

    cfg, settings = _settings(monkeypatch, agent)
    launch: LaunchSettings = settings.manager.launch
    assert launch.agent_class == agent_class
    assert settings.data_path.level.value == level
    assert settings.manager.n == 4 and settings.manager.mode == "sync"
    assert settings.run_id == agent.replace("_", "-")
    assert cfg.algorithm.adv_estimator == "grpo"
    assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode == "per_rollout_mean"
    assert cfg.actor_rollout_ref.rollout.name == "vllm"
    # The rows of a step fill whole mini-batches.
    assert cfg.data.train_batch_size % cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 0
    samples = load_samples(cfg.data.train_files)
    assert len(samples) >= cfg.data.train_batch_size
    config = launch.to_proto()
    for sample in samples:
        env = resolve_env_map(config.local.env_map, {"input": parse_input(json.dumps(sample.input))})
        assert env == {"AGL_TASK_QUESTION": sample.input["question"], "AGL_TASK_ANSWER": sample.input["answer"]}


def test_calc_config_switches_to_the_kubernetes_job_template(monkeypatch: pytest.MonkeyPatch) -> None:
    template = EXAMPLES / "calc_agent" / "job.yaml.j2"
    _, settings = _settings(
        monkeypatch, "calc_agent", "agl.launch.agent_class=null", f"agl.launch.k8s_job_template_file={template}"
    )
    launch = settings.manager.launch
    assert launch.agent_class == "" and launch.k8s_job_template == Path(template).read_text()
    assert launch.to_proto().k8s.job_template.startswith("{#-")
