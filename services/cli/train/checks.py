"""Checks before anything starts: each takes seconds and fails with one line naming the problem (exit 2).

Data files parse line by line, every --env-map path is in every task, the model directory is a causal LM with a
chat template, the agent imports (in a child interpreter with the agent's import path, as the controller will
run it) and has run(), the output folder is writable, the CPU engine is installed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from services.code_root import CHECKOUT
from services.controller.core.agent_env import ConfigError, resolve_env_map

from ..errors import USAGE, CliError

# An agent class is loaded exactly as the controller's runner loads it.
_AGENT_PROBE = """
import sys
from services.controller.core.agent_runner import load_class
try:
    target = load_class(sys.argv[1])
except Exception as err:
    print(f"cannot be loaded: {type(err).__name__}: {err}")
    sys.exit(1)
if not isinstance(target, type):
    print(f"is a {type(target).__name__}, not a class")
    sys.exit(1)
if not callable(getattr(target, "run", None)):
    print("has no run() method (the controller calls Class().run())")
    sys.exit(1)
"""
# An import that hangs is refused; a slow one is not (anthropic's SDK took over 30 s on 2 busy cores, seen here).
AGENT_PROBE_TIMEOUT_S = 120.0


def load_tasks(path: Path, what: str = "--data") -> list[Any]:
    """Every task of a JSONL, JSON (a list) or parquet file; a bad line is named by file and line."""
    if not path.is_file():
        raise CliError(f"{what} {path}: no such file", USAGE)
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq

            tasks = pq.read_table(path).to_pylist()
        except Exception as err:  # pyarrow raises many types for a bad file
            raise CliError(f"{what} {path}: not a readable parquet file: {err}", USAGE) from None
    else:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise CliError(f"{what} {path}: cannot be read: {err}", USAGE) from None
        if suffix == ".json" and text.lstrip().startswith("["):
            try:
                tasks = json.loads(text)
            except ValueError as err:
                raise CliError(f"{what} {path}: not valid JSON: {err}", USAGE) from None
        elif suffix in (".jsonl", ".json"):
            tasks = []
            for number, line in enumerate(text.splitlines(), start=1):
                if not line.strip():
                    continue
                try:
                    tasks.append(json.loads(line))
                except ValueError as err:
                    raise CliError(f"{path}:{number}: not valid JSON: {err}", USAGE) from None
        else:
            raise CliError(f"{what} {path}: expected a .jsonl, .json or .parquet file", USAGE)
    if not tasks:
        raise CliError(f"{what} {path}: no tasks", USAGE)
    for number, task in enumerate(tasks, start=1):
        if not isinstance(task, dict):
            raise CliError(f"{path}:{number}: a task must be a JSON object, got {type(task).__name__}", USAGE)
    return tasks


def check_env_map(env_map: Mapping[str, str], tasks: Sequence[Any], path: Path) -> None:
    """Every variable resolves in every task, as the controller will resolve it."""
    for number, task in enumerate(tasks, start=1):
        context = {"input": task, "rollout_id": "check", "attempt_id": "check", "is_train": True}
        try:
            resolve_env_map(env_map, context)
        except ConfigError as err:
            raise CliError(f"{path}:{number}: --env-map: {err}", USAGE) from None


def check_model_dir(model: str, flag: str = "--model") -> Path:
    """A directory transformers can load as a causal LM whose tokenizer has a chat template."""
    path = Path(model).expanduser()
    if not path.is_dir():
        raise CliError(f"{flag} {model}: no such directory (a Hugging Face model folder, or 'tiny')", USAGE)
    if not (path / "config.json").is_file():
        raise CliError(f"{flag} {model}: no config.json, not a Hugging Face model directory", USAGE)
    try:
        config = json.loads((path / "config.json").read_text())
    except ValueError as err:
        raise CliError(f"{flag} {model}: config.json is not valid JSON: {err}", USAGE) from None
    architectures = config.get("architectures") or []
    if not any(str(name).endswith(("ForCausalLM", "LMHeadModel")) for name in architectures):
        raise CliError(f"{flag} {model}: config.json names no causal LM architecture ({architectures})", USAGE)
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise CliError(f"{flag} {model}: no weights (*.safetensors or *.bin)", USAGE)
    template = _chat_template(path)
    if not template:
        raise CliError(
            f"{flag} {model}: the tokenizer has no chat template; agents' chat calls need one "
            "(set chat_template in tokenizer_config.json or add chat_template.jinja)",
            USAGE,
        )
    return path.resolve()


# config.json keys that do not change what the weights compute or how they are laid out.
_CONFIG_NOTES = ("torch_dtype", "dtype", "transformers_version", "_name_or_path", "use_cache")
# The files that make the tokenizer and the chat template, compared byte for byte when either model has one.
_TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja",
                    "chat_template.json", "special_tokens_map.json", "added_tokens.json")  # fmt: skip


def check_same_family(model: Path, baseline: Path) -> None:
    """`agl eval --baseline`: the baseline's weights are loaded into the engine serving `model`, so both must be
    the same architecture (config.json, dtype aside) with the same tokenizer and chat template."""
    configs = [json.loads((path / "config.json").read_text()) for path in (model, baseline)]
    for key in sorted(set(configs[0]) | set(configs[1])):
        if key not in _CONFIG_NOTES and configs[0].get(key) != configs[1].get(key):
            raise CliError(
                f"--baseline {baseline}: config.json's {key} is {configs[1].get(key)!r}, the model's "
                f"{configs[0].get(key)!r}; the baseline is scored by loading its weights into the model's engine, "
                "so it must be the same architecture and tokenizer (the model's base, or another checkpoint of it)",
                USAGE,
            )
    for name in _TOKENIZER_FILES:
        mine, theirs = model / name, baseline / name
        if (mine.is_file() or theirs.is_file()) and (
            not mine.is_file() or not theirs.is_file() or mine.read_bytes() != theirs.read_bytes()
        ):
            raise CliError(
                f"--baseline {baseline}: its {name} differs from the model's: both are served with the model's "
                "tokenizer and chat template, so they must be the same",
                USAGE,
            )
    if _chat_template(model) != _chat_template(baseline):
        raise CliError(f"--baseline {baseline}: its chat template differs from the model's", USAGE)
    if not any(baseline.glob("*.safetensors")):
        raise CliError(f"--baseline {baseline}: no *.safetensors weights (the engine reloads safetensors only)", USAGE)


def _chat_template(path: Path) -> str:
    for name in ("chat_template.jinja", "chat_template.json"):
        if (path / name).is_file():
            return (path / name).read_text()
    try:
        tokenizer_config = json.loads((path / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return ""
    template = tokenizer_config.get("chat_template") or ""
    return template if isinstance(template, str) else json.dumps(template)


def agent_import_path(cwd: Path | None = None) -> list[str]:
    """Where the agent's modules are looked up: the directory agl runs in, then the user's PYTHONPATH."""
    here = str((cwd or Path.cwd()).resolve())
    return [here, *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]


def check_agent(agent_class: str, command: Sequence[str]) -> None:
    if command:
        program = command[0]
        if os.sep in program:
            if not (Path(program).is_file() and os.access(program, os.X_OK)):
                raise CliError(f"--command: {program} is not an executable file", USAGE)
        elif shutil.which(program) is None:
            raise CliError(f"--command: {program!r} is not on PATH", USAGE)
        script = command[1] if program.startswith("python") and len(command) > 1 else ""
        if script.endswith(".py") and not Path(script).is_file():
            raise CliError(f"--command: {command[1]}: no such file", USAGE)
        return
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*([str(CHECKOUT)] if CHECKOUT else []), *agent_import_path()])
    try:
        probe = subprocess.run(
            [sys.executable, "-c", _AGENT_PROBE, agent_class],
            env=env,
            capture_output=True,
            text=True,
            timeout=AGENT_PROBE_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        took = f"importing it took over {AGENT_PROBE_TIMEOUT_S:.0f}s"
        raise CliError(f"--agent-class {agent_class}: {took}", USAGE) from None
    if probe.returncode != 0:
        lines = probe.stdout.strip().splitlines() or probe.stderr.strip().splitlines() or ["failed"]
        why = lines[-1]
        raise CliError(f"--agent-class {agent_class}: {why}", USAGE)


def check_writable(folder: Path) -> Path:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".agl-write-check"
        probe.write_text("ok")
        probe.unlink()
    except OSError as err:
        raise CliError(f"--output {folder}: not writable ({err.strerror or err})", USAGE) from None
    return folder.resolve()


def check_engine_installed() -> None:
    from services.engine.config import parse_config
    from services.engine.launch import LaunchError, engine_python

    try:
        engine_python(parse_config(["--model-dir", "."]))  # AGL_ENGINE_PYTHON: the interpreter the engine will use
    except LaunchError as err:
        raise CliError(f"the CPU engine: {err}", USAGE) from None


def engine_context(model_dir: Path, wanted: int) -> int:
    """The engine's context length: prompt plus response, within the model's positions."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return wanted
    positions = config.get("max_position_embeddings")
    return min(wanted, int(positions)) if isinstance(positions, int) and positions > 0 else wanted
