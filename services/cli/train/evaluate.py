"""`agl eval`: the agent once on every task, served by --model at the validation temperature (the proxy's val
mode: greedy by default), through the same services as training. Prints the mean reward, writes one JSON line per
task (its input, state, reward, error and the model's last answer).

`--baseline DIR` scores a second model on the same tasks in the same run, for a before/after comparison (a run's
model against the base it was trained from): its weights are loaded into the same engine (the reload the trainer's
weight updates use, well under a second) instead of starting a second one, so it must share the model's
architecture and tokenizer. Each task is then marked better, worse or the same."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
import uuid
from pathlib import Path
from typing import Any, TextIO

from services._gen.agl.v1 import rollout_pb2

from ..errors import FAILURE, USAGE, CliError
from . import checks, collect, options
from .session import run_interruptible
from .signals import run_async
from .stack import Stack, running_stack, while_services_run

EVAL_LABEL = "agl_eval"
RESULTS_FILE = "eval.jsonl"
BASELINE_FILE = "baseline.jsonl"
KNOWN = ("data", "model", "baseline", "output", "concurrency", "agent_class", "command", "env_map", "rollout_timeout",
         "max_prompt_length", "max_response_length", "tool_call_parser")  # fmt: skip


def task_record(index: int, record: dict[str, Any], tokenizer: Any) -> dict[str, Any]:
    """One line of eval.jsonl; the answer is the last call's response tokens, decoded."""
    calls = record["calls"]
    answer = tokenizer.decode(calls[-1]["response_token_ids"], skip_special_tokens=True) if calls else None
    return {
        "task": index,
        "input": record["input"],
        "state": record["state"],
        "reward": record["reward"],
        "error": record.get("proxy_error") or record["error"] or None,
        "calls": len(record["calls"]),
        "answer": answer,
        # The weights that answered: 0 the model's, 1 the baseline's (loaded into the same engine).
        "model_version": calls[-1]["model_version"] if calls else None,
        "rollout_id": record["rollout_id"],
    }


def run_eval_command(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    """Ctrl-C and SIGTERM stop every service it started, with one line (as agl train)."""
    return run_interruptible("eval", lambda: evaluate_model(args, out)[0], out)


def evaluate_model(args: argparse.Namespace, out: TextIO) -> tuple[int, Path]:
    """The exit code and the output folder (its RESULTS_FILE: one line per task; BASELINE_FILE with --baseline)."""
    options.merge_config(args, options.EVAL_DEFAULTS, KNOWN)
    if args.data is None:
        raise CliError("--data FILE is required (the tasks to score)", USAGE)
    if not args.model or args.model == options.TINY_MODEL:
        raise CliError("--model DIR is required: the model to score (a run's model/ folder, or any HF model)", USAGE)
    agent_class, command = options.agent_launch(args)
    env_map = options.parse_env_map(args.env_map or [])
    tasks = checks.load_tasks(Path(args.data))
    checks.check_env_map(env_map, tasks, Path(args.data))
    model = checks.check_model_dir(str(args.model))
    baseline = checks.check_model_dir(str(args.baseline), "--baseline") if args.baseline else None
    if baseline is not None:
        checks.check_same_family(model, baseline)
    checks.check_agent(agent_class, command)
    eval_id = f"eval-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"
    output = checks.check_writable(Path(args.output) if args.output else options.RUNS_DIR / eval_id)
    checks.check_engine_installed()
    lengths = (args.max_prompt_length, args.max_response_length)
    compared = f", against the baseline {baseline}" if baseline else ""
    out.write(f"checks passed: {len(tasks)} tasks, model {model}{compared}, output {output}\n")
    labels = {EVAL_LABEL: eval_id}
    config = rollout_pb2.RolloutConfig(
        timeout_seconds=float(args.rollout_timeout),
        local=rollout_pb2.LocalLaunchConfig(agent_class=agent_class, command=list(command), env_map=env_map),
    )

    def specs(prefix: str) -> list[rollout_pb2.RolloutSpec]:
        return [
            rollout_pb2.RolloutSpec(
                rollout_id=f"{prefix}-t{index}",
                input_json=json.dumps(task),
                is_train=False,
                config=config,
                metadata=rollout_pb2.RolloutMetadata(labels={**labels, "agl_task": str(index)}),
            )
            for index, task in enumerate(tasks)
        ]

    waves = math.ceil(len(tasks) / int(args.concurrency))
    deadline = float(args.rollout_timeout) * waves + 300.0
    with running_stack(
        output,
        model_dir=model,
        max_model_len=checks.engine_context(model, sum(options.lengths("model", *lengths))),
        concurrency=int(args.concurrency),
        agent_path=checks.agent_import_path(),
        out=out,
        tool_call_parser=str(args.tool_call_parser),
        console=False,
    ) as stack:
        records = _score(stack, specs(eval_id), labels, deadline, out)
        base_records = None
        if baseline is not None:
            out.write(f"loading the baseline's weights into the engine: {baseline}\n")
            run_async(_serve_weights(stack, baseline))
            base_records = _score(stack, specs(f"{eval_id}-baseline"), labels, deadline, out)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    rows = _write_rows(output / RESULTS_FILE, records, tokenizer)
    mean = _summary(rows, output / RESULTS_FILE, "", out)
    if base_records is not None:
        base_rows = _write_rows(output / BASELINE_FILE, base_records, tokenizer)
        base_mean = _summary(base_rows, output / BASELINE_FILE, "baseline: ", out)
        better = sum(1 for a, b in zip(rows, base_rows, strict=True) if (a["reward"] or 0.0) > (b["reward"] or 0.0))
        worse = sum(1 for a, b in zip(rows, base_rows, strict=True) if (a["reward"] or 0.0) < (b["reward"] or 0.0))
        out.write(
            f"against the baseline: {mean - base_mean:+.3f} ({better} tasks better, {worse} worse, "
            f"{len(rows) - better - worse} the same)\n"
        )
    failed = sum(1 for row in rows if row["state"] != "succeeded")
    return (FAILURE if failed == len(rows) else 0), output


def _score(
    stack: Stack, specs: list[rollout_pb2.RolloutSpec], labels: dict[str, str], deadline: float, out: TextIO
) -> list[dict[str, Any]]:
    """Every spec once through the stack; the rollouts' records in the specs' order (deleted from the ledger)."""
    done = [0]

    def counted(record: dict[str, Any]) -> None:
        done[0] += 1
        if out.isatty():
            out.write(f"\rscored {done[0]}/{len(specs)}")
        elif done[0] == len(specs) or done[0] % max(1, len(specs) // 10) == 0:
            out.write(f"scored {done[0]}/{len(specs)}\n")
        out.flush()

    async def run_all() -> list[dict[str, Any]]:
        async with stack.client() as client:
            rollouts = collect.run_rollouts(client, specs, labels, deadline, on_record=counted)
            records = await while_services_run(stack, rollouts)  # a service that stops ends the wait
            await client.delete_rollouts([spec.rollout_id for spec in specs])
            return records

    try:
        records = run_async(run_all())
    except asyncio.TimeoutError:
        raise CliError(f"not every rollout ended within {deadline:.0f}s (agent logs: {stack.agent_logs})") from None
    if out.isatty():
        out.write("\n")
    return records


async def _serve_weights(stack: Stack, weights_dir: Path) -> None:
    """The engine reloads weights_dir in place and is registered at version 1 with the label it then reports (the
    proxies check it), as a trainer's weight update does; no call is in flight between the two passes."""
    from services.engine.control import EngineError
    from services.trainer.run.engine_push import EnginePushError, push_weights

    async with stack.client() as client:
        try:
            await push_weights(client, stack.model_name, weights_dir, 1)
        except (EnginePushError, EngineError) as err:
            raise CliError(f"the engine did not load the baseline's weights from {weights_dir}: {err}") from None


def _write_rows(path: Path, records: list[dict[str, Any]], tokenizer: Any) -> list[dict[str, Any]]:
    rows = [task_record(index, record, tokenizer) for index, record in enumerate(records)]
    with path.open("w") as sink:
        for row in rows:
            sink.write(json.dumps(row) + "\n")
    return rows


def _summary(rows: list[dict[str, Any]], path: Path, prefix: str, out: TextIO) -> float:
    """Prints the mean reward (a task without one counts 0, as a trainer's validation fills it) and the first
    problem; returns the mean."""
    rewards = [row["reward"] for row in rows if row["reward"] is not None]
    failed = sum(1 for row in rows if row["state"] != "succeeded")
    unrewarded = sum(1 for row in rows if row["state"] == "succeeded" and row["reward"] is None)
    mean = sum(rewards) / len(rows)
    out.write(
        f"{prefix}mean reward {mean:.3f} over {len(rows)} tasks ({len(rewards)} rewarded, {failed} failed, "
        f"{unrewarded} without a reward; those count as 0)\n{prefix}per task: {path}\n"
    )
    for row in rows:
        if row["state"] != "succeeded" or row["reward"] is None:
            out.write(
                f"{prefix}first problem: task {row['task']}: {row['state']}: {row['error'] or 'no reward posted'}\n"
            )
            break
    return mean
