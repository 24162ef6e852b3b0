"""The driver's launch without verl (services/trainer/ray_env.py): the runtime environment it computes for a CPU
run is the one verl's own function gives, and the driver's modules import neither verl nor torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from services.trainer import ray_env
from services.trainer.config import CONFIG_DIR, CONFIG_NAME

pytestmark = pytest.mark.trainer

REPO = Path(__file__).resolve().parents[2]


def _config(*overrides: str):  # type: ignore[no-untyped-def]
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(config_name=CONFIG_NAME, overrides=["placement=cpu", *overrides])


def _verls(config) -> dict:  # type: ignore[no-untyped-def]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # verl's and torch's import-time deprecation warnings
        from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    return get_ppo_ray_runtime_env(config)


@pytest.mark.parametrize(
    ("environ", "overrides"),
    [
        ({}, []),
        # Set here already: verl leaves those out; the determinism switches are forwarded.
        ({"TOKENIZERS_PARALLELISM": "false", "NCCL_DEBUG": "INFO", "PYTHONHASHSEED": "7"}, []),
        ({"VERL_FULL_DETERMINISM": "1", "VLLM_BATCH_INVARIANT": "1", "NCCL_ALGO": "Ring"}, []),
        # A job submitted with a working_dir keeps it; the torch profiler turns NVTX injection off.
        ({ray_env.RAY_JOB_CONFIG: json.dumps({"runtime_env": {"working_dir": "/job"}})}, []),
        ({}, ["global_profiler.tool=torch"]),
        ({"VERL_KEEP_NVTX_INJECTION": "1"}, ["global_profiler.tool=torch"]),
    ],
)
def test_the_cpu_runtime_env_is_the_one_verl_computes(
    monkeypatch: pytest.MonkeyPatch, environ: dict[str, str], overrides: list[str]
) -> None:
    names = {*ray_env.VERL_ENV_VARS, *ray_env.FORWARDED, *ray_env.FORWARDED_WHEN_SET, ray_env.RAY_JOB_CONFIG}
    for name in names | {"VERL_KEEP_NVTX_INJECTION", ray_env.NVTX_INJECTION}:
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    config = _config(*overrides)
    assert ray_env.cpu_runtime_env(config) == _verls(config)
    assert ray_env.verl_runtime_env(config) == _verls(config)


def test_ray_init_gets_the_configs_runtime_env_over_verls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NCCL_DEBUG", raising=False)
    config = _config("+ray_kwargs.ray_init.runtime_env.env_vars.NCCL_DEBUG=TRACE", "transfer_queue.enable=true")
    kwargs = ray_env.ray_init_kwargs(config)
    assert kwargs["runtime_env"]["env_vars"]["NCCL_DEBUG"] == "TRACE"  # the config's wins
    assert kwargs["runtime_env"]["env_vars"]["TRANSFER_QUEUE_ENABLE"] == "1"
    assert kwargs["runtime_env"]["env_vars"]["VLLM_LOGGING_LEVEL"] == "WARN"  # verl's kept
    assert kwargs["num_cpus"] == config.ray_kwargs.ray_init.num_cpus


def test_full_determinism_and_rl_insight_switch_the_driver_environment() -> None:
    environ: dict[str, str] = {}
    ray_env.set_run_switches(_config(), environ)
    assert environ == {}
    config = _config("actor_rollout_ref.rollout.full_determinism=true", "actor_rollout_ref.rollout.seed=5")
    ray_env.set_run_switches(config, environ)
    assert environ == {"VERL_FULL_DETERMINISM": "1", "VLLM_BATCH_INVARIANT": "1", "PYTHONHASHSEED": "5"}
    environ = {}
    ray_env.set_run_switches(_config("trainer.logger=[console,rl_insight]"), environ)
    assert environ == {"VERL_RL_INSIGHT_ENABLE": "1"}


def test_the_driver_composes_its_config_and_launches_without_importing_verl_or_torch() -> None:
    # What agl-trainer's driver imports on its way to ray.init (__main__, the runner and the checks it calls).
    code = (
        "import sys\n"
        "import services.trainer.__main__, services.trainer.runner, services.trainer.run.engine_push\n"
        "from services.trainer.config import CONFIG_DIR, CONFIG_NAME\n"
        "from hydra import compose, initialize_config_dir\n"
        "with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):\n"
        "    compose(config_name=CONFIG_NAME, overrides=['placement=cpu'])\n"
        "print(sorted(m for m in ('verl', 'torch', 'transformers', 'tensordict', 'vllm') if m in sys.modules))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=dict(os.environ), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_the_cpu_platform_module_is_the_one_the_environment_names() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from services.trainer.verl import cpu_platform

    assert cpu_platform.__name__ == ray_env.CPU_PLATFORM_MODULE
    assert ray_env.cpu_env()["VERL_USE_EXTERNAL_MODULES"] == cpu_platform.__name__
