"""`python -m services.engine`: the vLLM command line and environment composed from one config, and the one-line
errors a user gets before vLLM spends half a minute starting (run as a user runs it, in a subprocess)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from services.code_root import CHECKOUT
from services.engine.config import EngineConfig, parse_config
from services.engine.launch import (
    WORKER_EXTENSION,
    LaunchError,
    build_launch,
    engine_python,
)
from tests.support.engine import ENGINE_PYTHON, require_engine_venv
from tests.support.procs import REPO_ROOT


def model_dir(tmp_path: Path) -> Path:
    """Enough of a Hugging Face model directory for the launcher's checks (vLLM never sees it here)."""
    (tmp_path / "config.json").write_text("{}")
    return tmp_path


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "services.engine", *args],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env={"PATH": "/usr/bin:/bin", **(env or {})},
        timeout=60,
        check=False,
    )


def test_defaults_serve_the_trainers_model_name_on_loopback() -> None:
    config = parse_config(["--model-dir", "/m"], env={})
    assert config == EngineConfig(model_dir="/m")
    assert (config.served_model_name, config.host, config.port) == ("agl-policy", "127.0.0.1", 8011)
    assert (config.max_model_len, config.kv_cache_gib, config.dtype, config.enforce_eager) == (512, 1, "float32", True)


def test_env_gives_defaults_and_flags_win() -> None:
    env = {
        "AGL_ENGINE_MODEL_DIR": "/from-env",
        "AGL_ENGINE_PORT": "9000",
        "AGL_ENGINE_ENFORCE_EAGER": "false",
        "AGL_ENGINE_KV_CACHE_GIB": "2",
        "AGL_ENGINE_EXTRA_ARGS": "--seed 7",
        "AGL_ENGINE_API_KEY": "sekret",
    }
    config = parse_config(["--port", "9100", "--", "--max-num-seqs", "64"], env=env)
    assert config.model_dir == "/from-env" and config.port == 9100 and not config.enforce_eager
    assert config.kv_cache_gib == 2 and config.api_key == "sekret"
    assert config.extra_args == ("--seed", "7", "--max-num-seqs", "64")
    assert "sekret" not in repr(config)


def test_command_line_and_environment(tmp_path: Path) -> None:
    python = tmp_path / "python"
    python.write_text("")
    config = parse_config(
        ["--model-dir", str(model_dir(tmp_path)), "--python", str(python), "--port", "8123", "--", "--seed", "3"],
        env={"AGL_ENGINE_API_KEY": "k1", "AGL_ENGINE_KV_CACHE_GIB": "3"},
    )
    launch = build_launch(config, {"PYTHONPATH": "/elsewhere", "VLLM_API_KEY": "stale", "HOME": "/h"})
    argv = list(launch.argv)
    assert argv[:3] == [str(python), "-m", "vllm.entrypoints.openai.api_server"]
    options = dict(zip(argv[3::2], argv[4::2], strict=False))
    assert options["--model"] == str(tmp_path.resolve()) and options["--served-model-name"] == "agl-policy"
    assert options["--port"] == "8123" and options["--host"] == "127.0.0.1"
    assert options["--max-model-len"] == "512" and options["--dtype"] == "float32"
    assert options["--worker-extension-cls"] == WORKER_EXTENSION
    assert "--enforce-eager" in argv and argv[-2:] == ["--seed", "3"]
    assert "k1" not in argv  # the key travels in the environment, not where `ps` shows it
    env = launch.env
    assert env["VLLM_SERVER_DEV_MODE"] == "1" and env["VLLM_CPU_KVCACHE_SPACE"] == "3"
    assert env["HF_HUB_OFFLINE"] == "1" and env["VLLM_API_KEY"] == "k1" and env["HOME"] == "/h"
    assert env["PYTHONPATH"].split(":") == [str(CHECKOUT), "/elsewhere"]
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"  # the model runs in the engine core's process


def test_worker_process_puts_the_model_in_a_process_of_its_own(tmp_path: Path) -> None:
    python = tmp_path / "python"
    python.write_text("")
    base = ["--model-dir", str(model_dir(tmp_path)), "--python", str(python)]
    by_flag = build_launch(parse_config([*base, "--worker-process"], env={}), {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    by_env = build_launch(parse_config(base, env={"AGL_ENGINE_WORKER_PROCESS": "true"}), {})
    assert by_flag.env["VLLM_ENABLE_V1_MULTIPROCESSING"] == by_env.env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"


def test_no_eager_and_no_key(tmp_path: Path) -> None:
    python = tmp_path / "python"
    python.write_text("")
    config = parse_config(["--model-dir", str(model_dir(tmp_path)), "--python", str(python), "--no-enforce-eager"])
    launch = build_launch(config, {"VLLM_API_KEY": "inherited"})
    assert "--enforce-eager" not in launch.argv and "VLLM_API_KEY" not in launch.env


def test_lora_rank_enables_runtime_adapters(tmp_path: Path) -> None:
    python = tmp_path / "python"
    python.write_text("")
    base = ["--model-dir", str(model_dir(tmp_path)), "--python", str(python)]
    launch = build_launch(parse_config([*base, "--lora-rank", "16", "--max-loras", "2"], env={}), {})
    argv = list(launch.argv)
    assert argv[argv.index("--max-lora-rank") + 1] == "16" and argv[argv.index("--max-loras") + 1] == "2"
    assert "--enable-lora" in argv and launch.env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    plain = build_launch(parse_config(base, env={}), {})
    assert "--enable-lora" not in plain.argv and "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in plain.env


def test_missing_engine_venv_says_how_to_make_it(tmp_path: Path) -> None:
    with pytest.raises(LaunchError, match=r"no engine venv at .*: run `make engine-venv` .* or set AGL_ENGINE_PYTHON"):
        engine_python(EngineConfig(model_dir="/m"), engine_venv=tmp_path / "absent")


def test_a_half_installed_engine_venv_says_how_to_finish_it(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").write_text("")
    with pytest.raises(LaunchError, match=r"engine venv at .* is not fully installed: run `make engine-venv`"):
        engine_python(EngineConfig(model_dir="/m"), engine_venv=tmp_path)


def test_tests_fail_rather_than_skip_without_the_engine_venv(tmp_path: Path) -> None:
    with pytest.raises(pytest.fail.Exception, match=r"run `make engine-venv` first"):
        require_engine_venv(tmp_path / "bin" / "python")


def test_the_checkouts_engine_venv_is_found() -> None:
    assert engine_python(EngineConfig(model_dir="/m")) == str(ENGINE_PYTHON)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "--model-dir (or AGL_ENGINE_MODEL_DIR) is required"),
        (["--model-dir", "/no/such/model"], "model dir /no/such/model does not exist"),
        (["--model-dir", "/tmp"], "model dir /tmp has no config.json"),
        (["--model-dir", "{model}", "--python", "/no/python"], "engine python /no/python does not exist"),
        (["--model-dir", "{model}", "--port", "0"], "--port wants a port from 1 to 65535, not '0'"),
        (["--model-dir", "{model}", "--max-loras", "2"], "--max-loras (AGL_ENGINE_MAX_LORAS) needs --lora-rank"),
        (["--model-dir", "{model}", "--lora-rank", "-1"], "--lora-rank wants an integer, 0 or more"),
    ],
)
def test_cli_errors_are_one_line_and_exit_2(args: list[str], message: str, tmp_path: Path) -> None:
    result = run_cli(*(arg.format(model=model_dir(tmp_path)) for arg in args))
    assert result.returncode == 2
    assert message in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("agl-engine: error:") and message in last
