"""Options of `agl train`, `agl eval` and `agl export`: flags, a YAML file holding the same keys, and the checks
that need no file or service (a bad combination is a usage error, exit 2, one line).

The YAML file (`--config FILE`) takes every flag by its long name (dashes or underscores) plus `overrides:`, a list
of Hydra overrides for the trainer; flags given on the command line win over the file. Hydra overrides may also
follow the options (`agl train ... -- trainer.seed=3`).
"""

from __future__ import annotations

import argparse
import math
import re
import shlex
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import USAGE, CliError
from .prompt_fit import tiny_positions
from .roles import add_role_options

TINY_MODEL = "tiny"
RUNS_DIR = Path("agl-runs")
PLACEMENTS = ("auto", "cpu", "gpu")
EXPORT_DTYPES = ("trained", "float32", "bfloat16", "float16")
# Which of a run's weights `agl export` writes (services/cli/train/export.py).
WEIGHT_CHOICES = ("best", "last")
# Which rollouts a judge scores (services/trainer/judge/group_judge.py: SCOPES).
JUDGE_SCOPES = ("missing", "all")
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Learning rates that move a model without wrecking it: the ~1 M-parameter tiny model needs a large one.


def bounded(kind: type, low: float, *, strict: bool = False) -> Callable[[str], Any]:
    """An argparse type: kind(text), finite, at least low (above it when strict)."""
    what = "a whole number" if kind is int else "a number"

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if not math.isfinite(value) or value < low or (strict and value == low):
            raise argparse.ArgumentTypeError(f"must be {'above' if strict else 'at least'} {low:g} (got {text})")
        return value

    return parse


positive_int = bounded(int, 1)
non_negative_int = bounded(int, 0)
positive_float = bounded(float, 0, strict=True)
non_negative_float = bounded(float, 0)


def _add_agent_options(parser: argparse.ArgumentParser, *, engine: bool = True) -> None:
    """The options that say which agent runs and how (shared by train, eval and try). engine: the engine's own
    option (--tool-call-parser); `agl try`'s stand-in engine has no tool-call parser to choose."""
    group = parser.add_argument_group("the agent and its tasks")
    which = group.add_mutually_exclusive_group()
    which.add_argument("--agent-class", help="the agent as module:Class (importable from this directory)")
    which.add_argument("--command", help='the agent as a command line, e.g. "python agent.py"')
    group.add_argument(
        "--env-map",
        action="append",
        default=None,
        metavar="NAME=VALUE",
        help="an environment variable for the agent: VALUE input.FIELD takes the task's field (repeat it)",
    )
    group.add_argument("--rollout-timeout", type=positive_float, default=None, help="seconds per rollout (600)")
    group.add_argument(
        "--max-prompt-length",
        type=positive_int,
        default=None,
        help="tokens of a row's prompt (tiny 256, else 2048); the tiny model holds up to 65,536 with the response",
    )
    group.add_argument(
        "--max-response-length", type=positive_int, default=None, help="tokens of a response (tiny 256, else 1024)"
    )
    if engine:
        group.add_argument(
            "--tool-call-parser",
            default=None,
            help="vLLM's parser for the model's tool calls (hermes; e.g. llama3_json, mistral; none: no tools)",
        )
    group.add_argument("--config", type=Path, help="a YAML file with any of these options (flags win)")


def add_train_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "train",
        help="train your agent on your tasks on this machine (starts and stops every service)",
        description="Starts the ledger, the proxy, the controller and an engine on free loopback ports, checks "
        "everything first, trains with GRPO and writes a Hugging Face model directory at the end.",
    )
    p.add_argument("--data", type=Path, help="training tasks: JSONL (one JSON object per line), JSON or parquet")
    p.add_argument("--val", type=Path, help="held-out tasks, scored greedily every --val-every steps")
    p.add_argument(
        "--detach",
        action="store_true",
        help="run in the background after the checks (output in RUN/train.log; agl logs RUN -f, agl stop RUN)",
    )
    _add_agent_options(p)
    group = p.add_argument_group("the model and the run")
    group.add_argument("--model", default=None, help="a Hugging Face model directory, or 'tiny' (the default)")
    group.add_argument("--steps", type=positive_int, default=None, help="GRPO steps (20)")
    group.add_argument("--tasks-per-step", type=positive_int, default=None, help="tasks per step (8)")
    group.add_argument("--group-size", type=positive_int, default=None, help="rollouts per task (4)")
    group.add_argument(
        "--lr",
        type=non_negative_float,
        default=None,
        help="learning rate (by the model's size: 1e-4 at 1 M parameters down to 1e-6 at 10 B)",
    )
    group.add_argument(
        "--sft-data",
        type=Path,
        help="supervised examples to warm-start the model from before RL (JSONL: chats with their answers, "
        "prompt/answer pairs, or an earlier run's trajectories.jsonl)",
    )
    group.add_argument(
        "--sft-steps", type=positive_int, default=None, help="supervised steps (tiny 300, else 3 epochs)"
    )
    group.add_argument(
        "--sft-lr", type=positive_float, default=None, help="supervised learning rate (tiny 1e-3, else 1e-5)"
    )
    group.add_argument("--val-every", type=non_negative_int, default=None, help="steps between held-out scores (10)")
    group.add_argument("--save-every", type=positive_int, default=None, help="steps between checkpoints (10)")
    group.add_argument("--placement", choices=PLACEMENTS, default=None, help="auto: GPUs when present, else CPU")
    group.add_argument("--export-dtype", choices=EXPORT_DTYPES, default=None, help="dtype of the model written")
    group.add_argument(
        "--export-weights",
        choices=WEIGHT_CHOICES,
        default=None,
        help="which weights the run's model/ gets: best (the best held-out score's; the default with --val and "
        "--val-every > 0) or last (the last step's; the default otherwise)",
    )
    group.add_argument(
        "--lora-rank",
        type=non_negative_int,
        default=None,
        help="train a LoRA adapter of this rank instead of every weight (CPU placement; 0: off)",
    )
    group.add_argument("--lora-alpha", type=positive_int, default=None, help="LoRA's alpha (twice the rank)")
    group.add_argument(
        "--merge-adapter", action="store_true", help="LoRA: also write the base model with the adapter merged in"
    )
    group.add_argument(
        "--report-to",
        action="append",
        default=None,
        metavar="TARGET",
        help="the metrics also to tensorboard, wandb or mlflow (repeat it or separate with commas)",
    )
    judge = p.add_argument_group("rewards from a judge model (docs: training/judge)")
    judge.add_argument(
        "--judge",
        type=Path,
        metavar="RUBRIC_FILE",
        help="a judge model scores each group's answers by this rubric (a text file), for rollouts without a reward",
    )
    judge.add_argument(
        "--judge-url",
        metavar="URL",
        help="the judge's OpenAI-compatible base URL (ending in /v1); without it the run's own policy judges (the "
        "tiny model cannot judge usefully)",
    )
    judge.add_argument("--judge-model", metavar="NAME", help="the model the --judge-url endpoint serves")
    judge.add_argument(
        "--judge-key-env", metavar="VAR", help="the environment variable that holds the --judge-url endpoint's key"
    )
    judge.add_argument(
        "--judge-scope",
        choices=JUDGE_SCOPES,
        default=None,
        help="missing: only rollouts whose agent posted no reward (the default); all: the judge's reward counts "
        "over the agent's",
    )
    add_role_options(p)
    group.add_argument("--output", type=Path, help="results folder (agl-runs/RUN_ID)")
    group.add_argument("--run-id", help="names the run (a new one unless --resume)")
    group.add_argument("--resume", action="store_true", help="continue --run-id from its last checkpoint")
    group.add_argument(
        "--allow-no-learning", action="store_true", help="exit 0 even when no step had a learning signal"
    )
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="Hydra overrides for the trainer")
    return p


def add_try_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "try",
        help="try your agent on a few tasks in seconds, before you train (a stand-in engine, no training)",
        description="Starts the ledger, the proxy, the controller and the stand-in engine (vLLM-shaped, no model), "
        "runs the agent on the first --tasks tasks, and shows each rollout's model calls, its reward and the rows "
        "training would take from it. Every problem is one line; the exit code is 0 only when every rollout "
        "succeeded with a reward. It takes the options of `agl train` that say which agent runs (and the same "
        "--config file, whose training-only keys it leaves to agl train).",
    )
    p.add_argument("--data", type=Path, help="the tasks: JSONL (one JSON object per line), JSON or parquet")
    p.add_argument("--tasks", type=positive_int, default=None, help="how many of the first tasks to run (4)")
    p.add_argument(
        "--model",
        default=None,
        help="the model agl train will train ('tiny' or a directory): only its row limits are used here",
    )
    _add_agent_options(p, engine=False)
    return p


def add_eval_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "eval",
        help="score a model: the agent on every task at the validation temperature",
        description="Starts the services and an engine serving --model, runs the agent once on every task "
        "(greedy, as validation does), prints the mean reward and writes one JSON line per task.",
    )
    p.add_argument("--data", type=Path, help="the tasks to score")
    p.add_argument("--model", default=None, help="a Hugging Face model directory (a run's model/ folder)")
    p.add_argument(
        "--baseline",
        default=None,
        help="a second model scored on the same tasks for a before/after comparison (the model's base: same "
        "architecture and tokenizer; its weights are loaded into the same engine)",
    )
    p.add_argument("--output", type=Path, help="where the per-task JSONL goes (agl-runs/eval-<time>)")
    p.add_argument("--concurrency", type=positive_int, default=None, help="rollouts at once (16)")
    _add_agent_options(p)
    return p


def add_export_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("export", help="write a run's best (or last) weights as a Hugging Face model directory")
    p.add_argument("run", help="a run id (under agl-runs/) or a run's output folder")
    p.add_argument(
        "--weights",
        choices=WEIGHT_CHOICES,
        default=None,
        help="best: the best validation's (the default when the run kept them); last: the last step's",
    )
    p.add_argument("--to", type=Path, help="the directory to write (RUN/model; a LoRA run's adapter: RUN/adapter)")
    p.add_argument("--dtype", choices=EXPORT_DTYPES, default="trained", help="dtype of the weights written")
    p.add_argument(
        "--merge-adapter", action="store_true", help="a LoRA run: also write the base model with the adapter merged"
    )
    return p


# -- merging flags with the YAML file --------------------------------------------------------------------------

TRAIN_DEFAULTS: dict[str, Any] = {
    "env_map": [],
    "tool_call_parser": "hermes",
    "rollout_timeout": 600.0,
    "model": TINY_MODEL,
    "steps": 20,
    "tasks_per_step": 8,
    "group_size": 4,
    "lr": None,
    "val_every": 10,
    "save_every": 10,
    "placement": "auto",
    "export_dtype": "trained",
    "lora_rank": 0,
}
EVAL_DEFAULTS: dict[str, Any] = {
    "env_map": [],
    "tool_call_parser": "hermes",
    "rollout_timeout": 600.0,
    "concurrency": 16,
}
TRY_DEFAULTS: dict[str, Any] = {
    "env_map": [],
    "tasks": 4,
    "model": TINY_MODEL,
    # A try shows mistakes in seconds: an agent still running after a minute is reported as one.
    "rollout_timeout": 60.0,
}
_PATHS = ("data", "val", "output", "model", "judge")


def read_config_file(path: Path) -> dict[str, Any]:
    import yaml

    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CliError(f"--config {path}: no such file", USAGE) from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise CliError(f"--config {path}: cannot be read as YAML: {err}".replace("\n", " "), USAGE) from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise CliError(f"--config {path}: expected a mapping of option names, got {type(loaded).__name__}", USAGE)
    return {str(key).replace("-", "_"): value for key, value in loaded.items()}


def merge_config(args: argparse.Namespace, defaults: Mapping[str, Any], known: Sequence[str]) -> argparse.Namespace:
    """Fills options left unset from --config, then from defaults; unknown file keys are refused. args.given: the
    options the user set (on the command line or in the file), for the checks that refuse an unused one."""
    from_file = read_config_file(args.config) if getattr(args, "config", None) else {}
    args.given = {name for name in known if getattr(args, name, None) not in (None, [], False)} | (
        set(from_file) & set(known)
    )
    base = args.config.parent if getattr(args, "config", None) else Path(".")
    unknown = sorted(set(from_file) - set(known) - {"overrides"})
    if unknown:
        raise CliError(f"--config {args.config}: unknown option(s) {', '.join(unknown)}", USAGE)
    for name in known:
        if getattr(args, name, None) not in (None, []):
            continue
        if name in from_file:
            value = from_file[name]
            if name in _PATHS and isinstance(value, str) and value != TINY_MODEL:
                value = base / value
            setattr(args, name, value)
        elif name in defaults:
            setattr(args, name, defaults[name])
    if "overrides" in from_file:
        extra = from_file["overrides"]
        if not isinstance(extra, list) or not all(isinstance(item, str) for item in extra):
            raise CliError(f"--config {args.config}: overrides must be a list of KEY=VALUE strings", USAGE)
        args.overrides = [*extra, *getattr(args, "overrides", [])]
    return args


# -- the normalised options --------------------------------------------------------------------------------------


def parse_env_map(items: Sequence[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in items:
        name, sep, value = str(item).partition("=")
        if not sep or not ENV_NAME.match(name):
            raise CliError(f"--env-map {item!r}: expected NAME=VALUE with NAME a variable name", USAGE)
        if name.startswith("AGL_") and name.split("_", 1)[1] in ("OPENAI_BASE_URL", "EVENT_URL", "KEY"):
            raise CliError(f"--env-map {name}: the controller sets it for every rollout", USAGE)
        env[name] = value
    return env


def agent_launch(args: argparse.Namespace) -> tuple[str, tuple[str, ...]]:
    """(agent class, command argv): exactly one is set."""
    if args.agent_class:
        if ":" not in args.agent_class and "." not in args.agent_class:
            raise CliError(f"--agent-class {args.agent_class!r}: expected module:Class", USAGE)
        return str(args.agent_class), ()
    if args.command:
        argv = tuple(shlex.split(str(args.command))) if isinstance(args.command, str) else tuple(args.command)
        if not argv:
            raise CliError("--command is empty", USAGE)
        return "", argv
    raise CliError("say which agent to run: --agent-class module:Class or --command 'python agent.py'", USAGE)


def check_overrides(overrides: Sequence[str]) -> list[str]:
    for item in overrides:
        if "=" not in item:
            raise CliError(f"{item!r} is neither an option nor a Hydra override KEY=VALUE", USAGE)
    return list(overrides)


def new_run_id() -> str:
    return f"train-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"


def check_run_id(run_id: str) -> str:
    if not _RUN_ID.match(run_id):
        raise CliError(f"--run-id {run_id!r}: use letters, digits, '_', '.' and '-' (64 at most)", USAGE)
    return run_id


# Row limits by model: the tiny model has 512 positions (its long-context variant, for longer rows, 65,536).
LENGTHS = {TINY_MODEL: (256, 256), "model": (2048, 1024)}


def lengths(model: str, prompt: int | None, response: int | None) -> tuple[int, int]:
    """The row limits for --model; rows the tiny model cannot hold are refused (one line)."""
    prompt_default, response_default = LENGTHS[TINY_MODEL if model == TINY_MODEL else "model"]
    found = prompt or prompt_default, response or response_default
    if model == TINY_MODEL:
        tiny_positions(*found)
    return found
