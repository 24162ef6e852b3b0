"""AGL's Python API: what `agl train`, `agl try`, `agl eval`, `agl export` and `agl runs --from` do, as functions.

    from services import api as agl

    result = agl.train(agent_class="myagent.agent:MyAgent", data="tasks.jsonl", val="val.jsonl",
                       env_map={"QUESTION": "input.question"}, sft_data="examples.jsonl", steps=40)
    print(result.ok, result.model, result.metrics[-1])

Each function takes the command's options as keyword arguments (their long names, dashes as underscores) and goes
through the command's own parser, checks and code: the same defaults, the same one-line errors (raised as
`AglError`, with the exit code the command would have), the same run folder. Progress lines go to `out`
(standard output unless given). A run that starts but fails is a result with `ok` False and its exit code; the
run folder holds what it wrote, as after the command.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TextIO

from services.cli.errors import USAGE, CliError

Options = Mapping[str, Any]


class AglError(Exception):
    """A command refused its input or stopped: the command's one line, and its exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class TrainResult:
    exit_code: int
    run_id: str
    output: Path  # the run folder
    model: Path | None  # output/model once written (a LoRA run without merge: None, see adapter)
    adapter: Path | None  # a LoRA run's adapter/
    metrics: list[dict[str, Any]]  # every step the trainer logged (metrics.jsonl): {"step": N, "data": {...}}

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@dataclass(frozen=True)
class EvalResult:
    exit_code: int
    results: Path | None  # one JSON line per task
    rows: list[dict[str, Any]]

    @property
    def mean_reward(self) -> float:
        """A task without a reward counts 0, as agl eval counts it."""
        return sum(row.get("reward") or 0.0 for row in self.rows) / len(self.rows) if self.rows else 0.0


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse would exit the caller's process
        raise CliError(message, USAGE)


def _parse(add: Any, options: Options, positional: Sequence[str] = ()) -> argparse.Namespace:
    """The command's parser (add: its add_*_parser) on the keyword options; a name it has no option for is
    refused by name (as a flag, argparse would take its value for a Hydra override)."""
    holder = _Parser(prog="agl")
    parser: argparse.ArgumentParser = add(holder.add_subparsers(parser_class=_Parser))
    known = {action.dest for action in parser._actions if action.option_strings}
    unknown = sorted(set(options) - known)
    if unknown:
        raise CliError(f"unknown option(s) {', '.join(unknown)}; this command takes {', '.join(sorted(known))}", USAGE)
    return parser.parse_args(_argv(options, positional))


def _argv(options: Options, positional: Sequence[str] = ()) -> list[str]:
    """Keyword options as the command line the parser reads: None and False are left out, True is the bare flag,
    a list or tuple repeats the flag, a mapping (env_map) gives NAME=VALUE items."""
    argv: list[str] = []
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            argv.append(flag)
        elif isinstance(value, Mapping):
            for key, item in value.items():
                argv += [flag, f"{key}={item}"]
        elif isinstance(value, (list, tuple)):
            for item in value:
                argv += [flag, str(item)]
        else:
            argv += [flag, str(value)]
    return [*argv, *positional]


def _run(call: Any) -> Any:
    try:
        return call()
    except CliError as err:
        raise AglError(str(err), err.code) from None


def train(*, overrides: Sequence[str] = (), out: TextIO | None = None, **options: Any) -> TrainResult:
    """`agl train` (services/cli/train/session.py): every option of the command as a keyword (data, val,
    agent_class or command, env_map, model, steps, tasks_per_step, group_size, lr, sft_data, sft_steps, sft_lr,
    val_every, save_every, placement, export_dtype, export_weights, lora_rank, lora_alpha, merge_adapter, report_to,
    output, run_id, resume, allow_no_learning, rollout_timeout, max_prompt_length, max_response_length,
    tool_call_parser, judge, judge_url, judge_model, judge_key_env, judge_scope, config); `overrides`: Hydra
    overrides for the trainer."""
    from services.cli.train import options as train_options
    from services.cli.train.plan import plan_from_args
    from services.cli.train.session import METRICS_FILE
    from services.cli.train.session import train as run_plan

    if options.get("detach"):
        raise AglError(
            "detach: agl train --detach runs the command in the background; from Python, call train() in a thread or "
            "process of your own",
            USAGE,
        )
    args = _run(lambda: _parse(train_options.add_train_parser, options, overrides))
    plan = _run(lambda: plan_from_args(args))
    code = _run(lambda: run_plan(plan, out or sys.stdout))
    metrics_path = plan.output / METRICS_FILE
    metrics = [json.loads(line) for line in metrics_path.read_text().splitlines()] if metrics_path.is_file() else []
    model, adapter = plan.output / "model", plan.output / "adapter"
    return TrainResult(
        exit_code=code,
        run_id=plan.run_id,
        output=plan.output,
        model=model if (model / "config.json").is_file() else None,
        adapter=adapter if adapter.is_dir() else None,
        metrics=metrics,
    )


def try_agent(*, out: TextIO | None = None, **options: Any) -> int:
    """`agl try` (services/cli/train/trial.py): the agent on the first `tasks` tasks through the whole stack on
    the stand-in engine; the exit code (0: every rollout succeeded with a reward; each problem is a line in
    `out`). Options: data, tasks, agent_class or command, env_map, model, rollout_timeout, config."""
    from services.cli.train import options as train_options
    from services.cli.train.trial import try_agent as run_try

    args = _run(lambda: _parse(train_options.add_try_parser, options))
    code: int = _run(lambda: run_try(args, out or sys.stdout))
    return code


def evaluate(*, out: TextIO | None = None, **options: Any) -> EvalResult:
    """`agl eval` (services/cli/train/evaluate.py): the agent once on every task with `model` at the validation
    temperature. Options: model, baseline (scored on the same tasks: its rows in output/baseline.jsonl), data,
    agent_class or command, env_map, output, concurrency, rollout_timeout, tool_call_parser, config."""
    from services.cli.train import options as train_options
    from services.cli.train.evaluate import RESULTS_FILE, evaluate_model

    args = _run(lambda: _parse(train_options.add_eval_parser, options))
    code, output = _run(lambda: evaluate_model(args, out or sys.stdout))
    results = output / RESULTS_FILE if output is not None else None
    rows = [json.loads(line) for line in results.read_text().splitlines()] if results and results.is_file() else []
    return EvalResult(code, results if rows else None, rows)


def export(
    run: str | Path,
    *,
    to: str | Path | None = None,
    dtype: str = "trained",
    merge_adapter: bool = False,
    weights: str | None = None,
) -> Path:
    """`agl export` (services/cli/train/export.py): the run's weights as a Hugging Face model directory (a LoRA
    run: its adapter, and with merge_adapter the merged model); the directory written. weights: "best" (the best
    validation's), "last" (the last step's), None: the best when the run kept them."""
    from services.cli.train.export import export_run

    target = Path(to) if to else None
    written: Path = _run(lambda: export_run(str(run), target, dtype, merge_adapter, weights=weights))
    return written


def runs(from_dir: str | Path) -> list[dict[str, Any]]:
    """The runs in a finished run's stored ledger (`agl runs --from DIR`): each as the ledger's Run message in
    JSON form (run_id, state, step_count, last_step, labels, ...)."""
    from google.protobuf.json_format import MessageToDict

    from services.cli.stored import serving
    from services.client import LedgerClient

    async def listed(ledger: str, key: str) -> list[dict[str, Any]]:
        async with LedgerClient(ledger, key=key) as client:
            return [MessageToDict(run, preserving_proto_field_name=True) for run in await client.list_runs({}, [])]

    def read() -> list[dict[str, Any]]:
        with serving(from_dir, console=False) as served:
            return asyncio.run(listed(served.ledger, served.key))

    result: list[dict[str, Any]] = _run(read)
    return result
