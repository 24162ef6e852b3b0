"""The start-up check over the composed Hydra config (ours over verl 0.9.1's), and the GPU defaults it guards.

Every refusal names a key and a value to set; setting that value makes the config pass, and where verl's own
`validate_config` would fail later (inside the Ray job), it fails on the refused config too.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import InstantiationException
from omegaconf import OmegaConf
from verl.utils.config import omega_conf_to_dataclass, validate_config

from services.trainer.config import CONFIG_DIR, CONFIG_NAME, ConfigError, settings_from_config
from services.trainer.preflight import check_config, problems

pytestmark = pytest.mark.trainer

RUNNABLE = ("agl.launch.agent_class=examples.math_agent.agent:MathAgent", "data.train_files=/srv/tasks.jsonl")
ROLLOUT = "actor_rollout_ref.rollout"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    for name in ("AGL_RUN_ID", "AGL_MODEL_NAME", "AGL_PROXY_TRAIN_TEMPERATURE", "AGL_TRAINER_OUTPUT_DIR", "AGL_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def _compose(*overrides: str):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(config_name=CONFIG_NAME, overrides=list(overrides))


def _verl_validate(cfg) -> None:
    """What runner.py runs inside the Ray job (no reference policy, no critic: the shipped defaults)."""
    resolved = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    validate_config(config=resolved, use_reference_policy=False, use_critic=False)


def test_shipped_defaults_pass_the_check_and_verls_validation_on_one_gpu() -> None:
    cfg = _compose(*RUNNABLE)
    assert problems(cfg) == []
    check_config(cfg)
    _verl_validate(cfg)
    settings_from_config(cfg)
    assert cfg.trainer.n_gpus_per_node == 1 and cfg.trainer.nnodes == 1
    rollout = cfg.actor_rollout_ref.rollout
    assert rollout.name == "vllm" and rollout.tensor_model_parallel_size == 1
    assert cfg.data.max_prompt_length >= 4096 and cfg.agl.aggregation.max_prompt_length == cfg.data.max_prompt_length
    # No validation set unless one is named (verl's default is a gsm8k file).
    assert cfg.data.val_files is None
    # verl's own vLLM / SGLang servers get the routed name and the tool-call flags as server arguments.
    vllm = omega_conf_to_dataclass(rollout).engine_kwargs["vllm"]
    assert vllm == {
        "served_model_name": "agl-policy",
        "enable_auto_tool_choice": True,
        "tool_call_parser": "hermes",
        "enable_scale_out": True,  # the render/generate endpoints of the proxies' token continuation
    }
    assert rollout.engine_kwargs.sglang.served_model_name == "agl-policy"
    assert rollout.prometheus.served_model_name == "agl-policy"


def test_output_paths_are_absolute_and_follow_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    cfg = _compose(*RUNNABLE, "agl.run_id=exp7")
    for path in (cfg.trainer.default_local_dir, cfg.agl.state_dir):
        assert PurePosixPath(path).is_absolute(), path
    assert cfg.trainer.default_local_dir == f"{tmp_path}/home/agl-trainer/checkpoints/agl/exp7"
    assert cfg.agl.state_dir == f"{tmp_path}/home/agl-trainer/checkpoints/agl/exp7/agl_state"
    monkeypatch.setenv("AGL_TRAINER_OUTPUT_DIR", "/mnt/agl")
    cfg = _compose(*RUNNABLE, "agl.run_id=exp7")
    assert cfg.trainer.default_local_dir == "/mnt/agl/checkpoints/agl/exp7"
    assert settings_from_config(cfg).manager.state_path == PurePosixPath(
        "/mnt/agl/checkpoints/agl/exp7/agl_state/exp7.json"
    )


def test_the_model_name_reaches_the_engines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGL_MODEL_NAME", "qwen-policy")
    cfg = _compose(*RUNNABLE)
    assert cfg.actor_rollout_ref.rollout.engine_kwargs.vllm.served_model_name == "qwen-policy"
    assert problems(cfg) == []


def test_rollout_temperature_follows_the_proxies_train_temperature(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGL_PROXY_TRAIN_TEMPERATURE", "0.7")
    cfg = _compose(*RUNNABLE)
    assert cfg.agl.train_temperature == 0.7 and cfg.actor_rollout_ref.rollout.temperature == 0.7
    assert problems(cfg) == []
    [line] = problems(_compose(*RUNNABLE, f"{ROLLOUT}.temperature=1.0"))
    assert line.startswith(f"{ROLLOUT}.temperature=1.0: differs from agl.train_temperature=0.7")
    assert line.endswith(f"set {ROLLOUT}.temperature=0.7")
    monkeypatch.setenv("AGL_PROXY_TRAIN_TEMPERATURE", "keep")
    assert problems(_compose(*RUNNABLE, f"{ROLLOUT}.temperature=1.0"))[0].startswith("agl.train_temperature=keep:")


# (override that breaks it, the key the one line names, verl's validate_config also rejects it)
REFUSED = [
    (f"{ROLLOUT}.name=null", f"{ROLLOUT}.name", False),
    (f"{ROLLOUT}.name=hf", f"{ROLLOUT}.name", False),
    (f"{ROLLOUT}.tensor_model_parallel_size=2", f"{ROLLOUT}.tensor_model_parallel_size", False),
    (
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
        True,
    ),
    ("actor_rollout_ref.actor.ppo_micro_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size", True),
    (f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu=null", f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu", True),
    ("actor_rollout_ref.actor.ppo_mini_batch_size=16", "actor_rollout_ref.actor.ppo_mini_batch_size", True),
    ("trainer.n_gpus_per_node=3", "data.train_batch_size", True),
    (f"{ROLLOUT}.temperature=0.6", f"{ROLLOUT}.temperature", False),
    ("trainer.default_local_dir=checkpoints/run", "trainer.default_local_dir", False),
    ("agl.state_dir=state", "agl.state_dir", False),
    ("data.val_files='~/data/rlhf/gsm8k/test.parquet'", "data.val_files", False),
    ("data.train_files=null", "data.train_files", False),
    (f"{ROLLOUT}.engine_kwargs.vllm.served_model_name=null", f"{ROLLOUT}.engine_kwargs.vllm.served_model_name", False),
    (f"{ROLLOUT}.engine_kwargs.vllm.tool_call_parser=null", f"{ROLLOUT}.engine_kwargs.vllm.tool_call_parser", False),
    (f"{ROLLOUT}.prometheus.enable=true {ROLLOUT}.prometheus.served_model_name=x", f"{ROLLOUT}.prometheus", False),
    ("critic.enable=true", "critic.enable", False),
    ("algorithm.rollout_correction.bypass_mode=true", "algorithm.rollout_correction.bypass_mode", False),
]


@pytest.mark.parametrize(("override", "key", "verl_rejects"), REFUSED, ids=[r[0].split("=")[0] for r in REFUSED])
def test_each_refusal_is_one_line_naming_the_key_and_its_suggestion_works(
    override: str, key: str, verl_rejects: bool
) -> None:
    broken = (*RUNNABLE, *override.split(" "))
    if override.startswith("data.train_files"):
        broken = (RUNNABLE[0], override)
    cfg = _compose(*broken)
    with pytest.raises(ConfigError) as raised:
        check_config(cfg)
    line = problems(cfg)[0]
    assert "\n" not in str(raised.value) and str(raised.value).startswith(line) and line.startswith(key), line
    if verl_rejects:
        with pytest.raises((ValueError, AssertionError, InstantiationException)):
            _verl_validate(cfg)
    # The one line ends with "set <key>=<value>"; when the value is concrete, setting it fixes the config.
    match = re.search(r"; set (\S+)=(\S+)$", line)
    assert match, line
    fix_key, fix_value = match.groups()
    if not fix_value.startswith("<"):
        fixed = _compose(*broken, f"{fix_key}={fix_value}")
        assert problems(fixed) == []
        _verl_validate(fixed)


def test_several_problems_are_all_listed_and_the_error_says_how_many() -> None:
    cfg = _compose(*RUNNABLE, "trainer.n_gpus_per_node=3", "critic.enable=true")
    assert [line.split("=")[0] for line in problems(cfg)] == ["data.train_batch_size", "critic.enable"]
    with pytest.raises(ConfigError, match=r"\(and 1 more\)$"):
        check_config(_compose(*RUNNABLE, "critic.enable=true", f"{ROLLOUT}.temperature=0.5"))


def test_the_cpu_placement_passes_and_skips_the_checks_of_verls_own_engines() -> None:
    cfg = _compose(
        *RUNNABLE,
        "placement=cpu",
        f"{ROLLOUT}.tensor_model_parallel_size=2",
        f"{ROLLOUT}.engine_kwargs.vllm.served_model_name=x",
    )
    assert cfg.agl.engines.external is True
    assert problems(cfg) == []
    assert problems(_compose(*RUNNABLE, "placement=cpu", f"{ROLLOUT}.temperature=0.5"))[0].startswith(
        f"{ROLLOUT}.temperature"
    )
