"""What `agl train` was asked for: the options merged with --config and the defaults, checked before any service
starts (`plan_from_args`), and the run file that lets `--resume` find the run again."""

from __future__ import annotations

import argparse
import glob
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import USAGE, CliError
from . import checks, learning_rate, options, reporting, sft, stack, trainer_args
from .process_id import this_process
from .roles import role_overrides

RUN_FILE = "run.json"


@dataclass(frozen=True)
class AgentPlan:
    """Which agent runs on which tasks, and how: what `agl train` and `agl try` both check (agent_plan)."""

    data_file: Path
    tasks: list[Any]
    agent_class: str
    command: tuple[str, ...]
    env_map: dict[str, str]
    rollout_timeout: float
    max_prompt_length: int
    max_response_length: int


def agent_plan(args: argparse.Namespace) -> AgentPlan:
    """The agent's options (merged with --config already) checked: the launch, --env-map against every task of
    --data (each bad line named by file:line), the row limits for --model, and the agent loaded as the controller
    will load it (CliError, one line)."""
    if args.data is None:
        raise CliError("--data FILE is required (the training tasks, one JSON object per line)", USAGE)
    agent_class, command = options.agent_launch(args)
    env_map = options.parse_env_map(args.env_map or [])
    prompt, response = options.lengths(str(args.model), args.max_prompt_length, args.max_response_length)
    tasks = checks.load_tasks(Path(args.data))
    checks.check_env_map(env_map, tasks, Path(args.data))
    checks.check_agent(agent_class, command)
    return AgentPlan(
        data_file=Path(args.data).resolve(),
        tasks=tasks,
        agent_class=agent_class,
        command=command,
        env_map=env_map,
        rollout_timeout=float(args.rollout_timeout),
        max_prompt_length=prompt,
        max_response_length=response,
    )


@dataclass(frozen=True)
class JudgePlan:
    """--judge RUBRIC_FILE and the options that go with it, checked (the trainer's agl.judge)."""

    rubric: Path
    url: str | None = None  # None: the run's own policy judges
    model: str | None = None
    key_env: str | None = None
    scope: str = "missing"

    def overrides(self) -> list[str]:
        """The trainer's agl.judge.* settings (quoted: a URL holds characters Hydra's grammar reserves)."""
        found = [f"agl.judge.rubric={json.dumps(str(self.rubric))}", f"agl.judge.scope={self.scope}"]
        for name in ("url", "model", "key_env"):
            value = getattr(self, name)
            if value:
                found.append(f"agl.judge.{name}={json.dumps(value)}")
        return found


@dataclass
class TrainPlan:
    """Everything `agl train` was asked for, checked."""

    run_id: str
    output: Path
    train_file: Path
    val_file: Path | None
    tasks: list[Any]
    agent_class: str
    command: tuple[str, ...]
    env_map: dict[str, str]
    model: str  # a directory, or "tiny"
    placement: str  # "cpu" or "gpu"
    steps: int
    tasks_per_step: int
    group_size: int
    lr: float
    val_every: int
    save_every: int
    rollout_timeout: float
    max_prompt_length: int
    max_response_length: int
    export_dtype: str
    tool_call_parser: str
    resume: bool
    allow_no_learning: bool
    overrides: list[str] = field(default_factory=list)
    # Set by callers that prepared the model and the tasks themselves (make demo): extra trainer settings.
    extra_overrides: list[str] = field(default_factory=list)
    val_label: str = "held-out reward"
    multi_turn: bool = False
    checks_s: float = 0.0  # how long the checks took
    # LoRA (services/cli/train/lora.py): the adapter's rank (0: every weight is trained) and alpha; merge_adapter:
    # the base model with the adapter merged in is written too.
    lora_rank: int = 0
    lora_alpha: int = 0
    merge_adapter: bool = False
    # The supervised start (--sft-data, services/cli/train/sft.py): its examples and settings; None: none.
    sft_examples: list[sft.Example] = field(default_factory=list)
    supervised: sft.SupervisedSettings | None = None
    # The pre-flight's sampled groups (preflight.py); off where the caller measured the start itself (make demo).
    preflight: bool = True
    # --report-to (reporting.py): the metrics also to these loggers.
    report_to: tuple[str, ...] = ()
    # --export-weights: "best", "last", or None (the best when the run keeps one: export.choose_weights).
    export_weights: str | None = None
    # --judge and its options: rewards from a judge model (services/trainer/judge/); None: the agent's own.
    judge: JudgePlan | None = None
    # --role, --frozen-role, --unmapped-models (roles.py): the trainer's agl.roles settings; none without them.
    roles: list[str] = field(default_factory=list)


KNOWN = (
    "data", "val", "agent_class", "command", "env_map", "rollout_timeout", "max_prompt_length",
    "max_response_length", "model", "steps", "tasks_per_step", "group_size", "lr", "val_every", "save_every",
    "placement", "export_dtype", "output", "run_id", "resume", "allow_no_learning", "tool_call_parser", "lora_rank",
    "lora_alpha", "merge_adapter", "sft_data", "sft_steps", "sft_lr",
    "report_to", "export_weights", "judge", "judge_url", "judge_model", "judge_key_env", "judge_scope",
    "role", "frozen_role", "unmapped_models",
)  # fmt: skip


def plan_from_args(args: argparse.Namespace) -> TrainPlan:
    """The options merged with --config and the defaults, and every check that needs no service (CliError)."""
    options.merge_config(args, options.TRAIN_DEFAULTS, KNOWN)
    if args.data is None:
        raise CliError("--data FILE is required (the training tasks, one JSON object per line)", USAGE)
    options.agent_launch(args)  # a missing agent is named before the run's own options
    overrides = options.check_overrides(args.overrides or [])
    judge = judge_settings(args)
    roles = role_overrides(args)
    model = str(args.model)
    placement = resolve_placement(str(args.placement))
    if args.resume and not args.run_id and not args.output:
        raise CliError("--resume needs the run: --run-id ID (or --output DIR of the run)", USAGE)
    run_id = options.check_run_id(args.run_id) if args.run_id else ""
    output = Path(args.output) if args.output else None
    if output is not None and output.joinpath(RUN_FILE).is_file() and not run_id:
        run_id = str(json.loads(output.joinpath(RUN_FILE).read_text()).get("run_id", ""))
    run_id = run_id or options.new_run_id()
    output = (output or options.RUNS_DIR / run_id).resolve()
    recorded = read_run_file(output)
    if recorded is not None and not args.resume:
        raise CliError(
            f"run {recorded.get('run_id')} already exists in {output}; continue it with --resume, or choose another "
            "--run-id / --output",
            USAGE,
        )
    if args.resume:
        if recorded is None:
            raise CliError(f"--resume: no run to continue in {output} (no {RUN_FILE})", USAGE)
        if recorded.get("run_id") != run_id:
            raise CliError(f"--resume: {output} holds run {recorded.get('run_id')}, not {run_id}", USAGE)
    started = time.monotonic()
    agent = agent_plan(args)
    tasks = agent.tasks
    val_tasks = checks.load_tasks(Path(args.val), "--val") if args.val else []
    if val_tasks:
        checks.check_env_map(agent.env_map, val_tasks, Path(args.val))
    if len(tasks) < args.tasks_per_step:
        raise CliError(
            f"--data {args.data}: {len(tasks)} tasks, fewer than --tasks-per-step {args.tasks_per_step}", USAGE
        )
    if model != options.TINY_MODEL:
        model = str(checks.check_model_dir(model))
    if placement == "cpu":
        checks.check_engine_installed()
    if not val_tasks:
        if "val_every" in args.given:
            raise CliError("--val-every scores the held-out tasks: give them with --val FILE", USAGE)
        args.val_every = 0
    if args.export_weights == "best" and not int(args.val_every):
        raise CliError(
            "--export-weights best takes the weights of the best held-out score: give --val FILE and --val-every N > 0",
            USAGE,
        )
    lora_rank, lora_alpha = lora_settings(args, placement)
    if args.lr is not None:
        lr = float(args.lr)
    else:
        size = learning_rate.REFERENCE_PARAMETERS if model == options.TINY_MODEL else None
        lr = learning_rate.default_lr(size or learning_rate.parameter_count(Path(model)), lora=bool(lora_rank))
    examples, supervised = supervised_settings(args, model)
    report_to = reporting.parse_targets(args.report_to or [])
    reporting.check_targets(report_to)
    plan = TrainPlan(
        run_id=run_id,
        output=output,
        train_file=agent.data_file,
        val_file=Path(args.val).resolve() if args.val else None,
        tasks=tasks,
        agent_class=agent.agent_class,
        command=agent.command,
        env_map=agent.env_map,
        model=model,
        placement=placement,
        steps=int(args.steps),
        tasks_per_step=int(args.tasks_per_step),
        group_size=int(args.group_size),
        lr=lr,
        val_every=int(args.val_every),
        save_every=int(args.save_every),
        rollout_timeout=agent.rollout_timeout,
        max_prompt_length=agent.max_prompt_length,
        max_response_length=agent.max_response_length,
        export_dtype=str(args.export_dtype),
        tool_call_parser=str(args.tool_call_parser),
        resume=bool(args.resume),
        allow_no_learning=bool(args.allow_no_learning),
        overrides=overrides,
        lora_rank=lora_rank,
        lora_alpha=lora_alpha,
        merge_adapter=bool(args.merge_adapter),
        sft_examples=examples,
        supervised=supervised,
        report_to=report_to,
        export_weights=args.export_weights,
        judge=judge,
        roles=roles,
    )
    trainer_args.check(plan, stack.model_name())
    checks.check_writable(output)  # last: it makes the run folder, which a refused command should not leave
    plan.checks_s = time.monotonic() - started
    return plan


def supervised_settings(
    args: argparse.Namespace, model: str
) -> tuple[list[sft.Example], sft.SupervisedSettings | None]:
    """The examples of --sft-data, read and checked now; --sft-steps and --sft-lr are refused without them."""
    if args.sft_data is None:
        for name in ("sft_steps", "sft_lr"):
            if name in args.given:
                raise CliError(f"--{name.replace('_', '-')} applies to a supervised start: give --sft-data FILE", USAGE)
        return [], None
    examples = sft.load_examples(Path(args.sft_data))
    return examples, sft.default_settings(model, len(examples), args.sft_steps, args.sft_lr)


def judge_settings(args: argparse.Namespace) -> JudgePlan | None:
    """--judge and its options (one line for a combination that cannot work); the key is only looked for, never
    read into the plan: the trainer reads it from the variable."""
    if args.judge is None:
        for name in ("judge_url", "judge_model", "judge_key_env", "judge_scope"):
            if name in args.given:
                raise CliError(f"--{name.replace('_', '-')} applies to a judge: give --judge RUBRIC_FILE", USAGE)
        return None
    rubric = Path(args.judge)
    try:
        text = rubric.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CliError(f"--judge {rubric}: no such file (the rubric the judge scores by)", USAGE) from None
    except (OSError, UnicodeDecodeError) as err:
        raise CliError(f"--judge {rubric}: cannot be read as text: {err}", USAGE) from None
    if not text.strip():
        raise CliError(f"--judge {rubric}: the rubric file is empty", USAGE)
    url, model, key_env = args.judge_url or None, args.judge_model or None, args.judge_key_env or None
    if url is None:
        if model or key_env:
            which = "--judge-model" if model else "--judge-key-env"
            raise CliError(
                f"{which} applies to an external judge: give --judge-url URL too (without it the run's own policy "
                "judges, served by the run's engine)",
                USAGE,
            )
    else:
        if not str(url).startswith(("http://", "https://")):
            raise CliError(f"--judge-url {url}: an http:// or https:// base URL, e.g. https://host/v1", USAGE)
        if not model:
            raise CliError("--judge-url needs --judge-model NAME: the model that endpoint serves", USAGE)
    if key_env is not None:
        if not options.ENV_NAME.match(str(key_env)):
            raise CliError(f"--judge-key-env {key_env!r}: the name of an environment variable", USAGE)
        if not os.environ.get(str(key_env)):
            raise CliError(f"--judge-key-env {key_env}: the environment has no {key_env} (the judge's key)", USAGE)
    scope = str(args.judge_scope or "missing")
    return JudgePlan(rubric.resolve(), str(url) if url else None, str(model) if model else None, key_env, scope)


def lora_settings(args: argparse.Namespace, placement: str) -> tuple[int, int]:
    """(rank, alpha) of --lora-rank/--lora-alpha; the options that only a LoRA run uses are refused without it."""
    rank = int(args.lora_rank or 0)
    if not rank:
        for name in ("lora_alpha", "merge_adapter"):
            if name in args.given:
                raise CliError(f"--{name.replace('_', '-')} applies to a LoRA run: give --lora-rank R", USAGE)
        return 0, 0
    if placement != "cpu":
        raise CliError(
            "--lora-rank trains an adapter that the CPU placement's engine loads; on GPUs pass the trainer overrides "
            "actor_rollout_ref.model.lora_rank=R actor_rollout_ref.model.lora.merge=true (verl's replicas get the "
            "merged weights)",
            USAGE,
        )
    if "export_dtype" in args.given and not args.merge_adapter:
        raise CliError(
            "--export-dtype is the merged model's dtype in a LoRA run (the adapter is written as trained): add "
            "--merge-adapter",
            USAGE,
        )
    return rank, int(args.lora_alpha or 2 * rank)


def resolve_placement(placement: str) -> str:
    if placement == "cpu" or (placement == "auto" and not glob.glob("/dev/nvidia[0-9]*")):
        return "cpu"  # no NVIDIA device node: no need to import torch (seconds) to know
    try:
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        gpus = 0
    if placement == "gpu" and gpus == 0:
        raise CliError("--placement gpu: torch sees no CUDA device here", USAGE)
    return "gpu" if gpus else "cpu"


def read_run_file(output: Path) -> dict[str, Any] | None:
    path = output / RUN_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError:
        return {"run_id": "?"}


def write_run_file(plan: TrainPlan, base_model: Path, state: str, **extra: Any) -> None:
    record = {
        "run_id": plan.run_id,
        "state": state,
        "base_model": str(base_model),
        "weights": str(plan.output / "state" / "weights"),
        "agent_class": plan.agent_class,
        "command": list(plan.command),
        "data": str(plan.train_file),
        "val": str(plan.val_file) if plan.val_file else None,
        "env_map": plan.env_map,
        "lora_rank": plan.lora_rank,
        "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        # The process running the run, while it runs (agl runs --local, agl stop: background.py).
        **(this_process() if state == "running" else {}),
        **extra,
    }
    (plan.output / RUN_FILE).write_text(json.dumps(record, indent=2) + "\n")


def unfinished_runs_like(plan: TrainPlan, runs_dir: Path) -> list[tuple[str, int]]:
    """Runs in runs_dir that were interrupted with the same agent and training data as this new run: (run id, last
    step). Starting the same command again after Ctrl-C makes a new run; the user is told which one to resume."""
    found = []
    for run_file in sorted(runs_dir.glob(f"*/{RUN_FILE}")):
        record = read_run_file(run_file.parent) or {}
        same_agent = record.get("agent_class") == plan.agent_class and record.get("command") == list(plan.command)
        if record.get("state") == "interrupted" and same_agent and record.get("data") == str(plan.train_file):
            found.append((str(record.get("run_id")), int(record.get("step") or 0)))
    return found
