"""What verl's `run_ppo` does around `ray.init`, done on the driver without importing verl's training code.

verl's launch (verl.trainer.main_ppo) puts its determinism switches in the driver's environment and hands
ray.init a runtime environment of its own variables (verl.trainer.constants_ppo) merged under the config's
`ray_kwargs.ray_init.runtime_env`. Importing either module loads the whole of verl, torch and transformers: ~18 s
of CPU before ray.init on a 2-core machine, spent again in the task runner that needs them. So the driver
computes the same environment here: for a run without accelerators (trainer.device=cpu) from the values below,
which test_ray_env.py checks against verl's own function; for any other device with verl's function, because
there the variables depend on the accelerator it finds.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from omegaconf import OmegaConf

# The verl platform plug-in of CPU runs (verl/cpu_platform.py, which imports verl: named here, not imported).
PLATFORM_NAME = "cpu"
CPU_PLATFORM_MODULE = "services.trainer.verl.cpu_platform"


def cpu_env() -> dict[str, str]:
    """Environment that makes every verl process (Ray workers included) load and use the CPU platform."""
    return {
        "VERL_USE_EXTERNAL_MODULES": CPU_PLATFORM_MODULE,
        "VERL_PLATFORM": PLATFORM_NAME,
        # verl's workers pick attention and torch threads from these; one thread per rank leaves the other
        # cores to the engine and the agents.
        "TOKENIZERS_PARALLELISM": "false",
    }


# verl 0.9.1's PPO_RAY_RUNTIME_ENV variables, on a machine without accelerators (the GB200 NCCL and ROCm
# entries it adds are for those devices only).
VERL_ENV_VARS = {
    "TOKENIZERS_PARALLELISM": "true",
    "NCCL_DEBUG": "WARN",
    "VLLM_LOGGING_LEVEL": "WARN",
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "true",
    "VLLM_DISABLE_COMPILE_CACHE": "1",
    "HCCL_HOST_SOCKET_PORT_RANGE": "auto",
    "HCCL_NPU_SOCKET_PORT_RANGE": "auto",
    "HSA_NO_SCRATCH_RECLAIM": "1",
}
# Forwarded to every Ray process at launch: the first three always ("0" when unset), the rest when set.
FORWARDED = ("VERL_FULL_DETERMINISM", "VLLM_BATCH_INVARIANT", "VERL_RL_INSIGHT_ENABLE")
FORWARDED_WHEN_SET = (
    "PYTHONHASHSEED",
    "CUBLAS_WORKSPACE_CONFIG",
    "FLASH_ATTENTION_DETERMINISTIC",
    "NCCL_DETERMINISTIC",
    "NCCL_ALGO",
)
# The torch profiler's traces need NVTX injection off (a value that loads nothing), unless the user keeps theirs.
NVTX_INJECTION = "NVTX_INJECTION64_PATH"
NVTX_DISABLED = "/nonexistent/verl-disabled-nvtx-injection.so"
# Where Ray puts a submitted job's config (its runtime env, with the job's working_dir) for the entrypoint.
RAY_JOB_CONFIG = "RAY_JOB_CONFIG_JSON_ENV_VAR"


def set_run_switches(config: Any, environ: os._Environ[str] | dict[str, str] = os.environ) -> None:
    """The variables verl's launch sets in the driver's environment from the config (the runtime env forwards them)."""
    rollout = config.actor_rollout_ref.rollout
    reward_model = config.reward.reward_model
    if rollout.full_determinism or (reward_model.enable and reward_model.rollout.full_determinism):
        environ["VERL_FULL_DETERMINISM"] = "1"
        environ["VLLM_BATCH_INVARIANT"] = "1"
        environ["PYTHONHASHSEED"] = str(rollout.seed)
    loggers = config.trainer.get("logger", [])
    if "rl_insight" in ([loggers] if isinstance(loggers, str) else loggers or []):
        environ["VERL_RL_INSIGHT_ENABLE"] = "1"


def cpu_runtime_env(config: Any, environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """verl's runtime env for a run without accelerators: its variables less those already set here, the
    profiler's NVTX switch, the forwarded ones, and no working_dir unless a submitted job has one."""
    working_dir = json.loads(environ.get(RAY_JOB_CONFIG, "{}")).get("runtime_env", {}).get("working_dir")
    env_vars = {name: value for name, value in VERL_ENV_VARS.items() if environ.get(name) is None}
    profiler = OmegaConf.select(config, "global_profiler.tool", default=None)
    if profiler == "torch" and environ.get("VERL_KEEP_NVTX_INJECTION", "0") != "1":
        env_vars[NVTX_INJECTION] = NVTX_DISABLED
    env_vars.update({name: environ.get(name, "0") for name in FORWARDED})
    env_vars.update({name: environ[name] for name in FORWARDED_WHEN_SET if environ.get(name) is not None})
    return {"env_vars": env_vars, **({"working_dir": None} if working_dir is None else {})}


def verl_runtime_env(config: Any) -> dict[str, Any]:
    if str(config.trainer.get("device", "cuda")) == "cpu":
        return cpu_runtime_env(config)
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    return get_ppo_ray_runtime_env(config)


def ray_init_kwargs(config: Any) -> dict[str, Any]:
    """ray.init's arguments: the config's ray_kwargs.ray_init, its runtime_env merged over verl's."""
    kwargs = dict(OmegaConf.to_container(config.ray_kwargs.ray_init, resolve=True))
    defaults = verl_runtime_env(config)
    if config.transfer_queue.enable:
        defaults.setdefault("env_vars", {})["TRANSFER_QUEUE_ENABLE"] = "1"
    merged = OmegaConf.merge(defaults, kwargs.pop("runtime_env", None) or {})
    return {**kwargs, "runtime_env": OmegaConf.to_container(merged)}
