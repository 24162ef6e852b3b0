"""`agl eval`: the agent once on every task, served by --model at the validation temperature (the proxy's val
mode: greedy by default), through the same services as training. Prints the mean reward, writes one JSON line per
task (its input, state, reward, error and the model's last answer)."""

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
from .stack import CHECKOUT, running_stack, while_services_run

EVAL_LABEL = "agl_eval"
RESULTS_FILE = "eval.jsonl"
KNOWN = ("data", "model", "output", "concurrency", "agent_class", "command", "env_map", "rollout_timeout",
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
        "rollout_id": record["rollout_id"],
    }


def run_eval_command(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    """Ctrl-C and SIGTERM stop every service it started, with one line (as agl train)."""
    return run_interruptible("eval", lambda: evaluate_model(args, out)[0], out)


def evaluate_model(args: argparse.Namespace, out: TextIO) -> tuple[int, Path]:
    """The exit code and the output folder (its RESULTS_FILE: one line per task)."""
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
    checks.check_agent(agent_class, command, CHECKOUT)
    eval_id = f"eval-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"
    output = checks.check_writable(Path(args.output) if args.output else options.RUNS_DIR / eval_id)
    checks.check_engine_installed()
    lengths = (args.max_prompt_length, args.max_response_length)
    out.write(f"checks passed: {len(tasks)} tasks, model {model}, output {output}\n")
    labels = {EVAL_LABEL: eval_id}
    config = rollout_pb2.RolloutConfig(
        timeout_seconds=float(args.rollout_timeout),
        local=rollout_pb2.LocalLaunchConfig(agent_class=agent_class, command=list(command), env_map=env_map),
    )
    specs = [
        rollout_pb2.RolloutSpec(
            rollout_id=f"{eval_id}-t{index}",
            input_json=json.dumps(task),
            is_train=False,
            config=config,
            metadata=rollout_pb2.RolloutMetadata(labels={**labels, "agl_task": str(index)}),
        )
        for index, task in enumerate(tasks)
    ]
    waves = math.ceil(len(specs) / int(args.concurrency))
    deadline = float(args.rollout_timeout) * waves + 300.0
    results_path = output / RESULTS_FILE
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
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    rows = [task_record(index, record, tokenizer) for index, record in enumerate(records)]
    with results_path.open("w") as sink:
        for row in rows:
            sink.write(json.dumps(row) + "\n")
    rewards = [row["reward"] for row in rows if row["reward"] is not None]
    failed = sum(1 for row in rows if row["state"] != "succeeded")
    unrewarded = sum(1 for row in rows if row["state"] == "succeeded" and row["reward"] is None)
    # A task without a reward scores 0 in the mean, as a trainer's validation fills it.
    mean = sum(rewards) / len(rows)
    out.write(
        f"mean reward {mean:.3f} over {len(rows)} tasks ({len(rewards)} rewarded, {failed} failed, "
        f"{unrewarded} without a reward; those count as 0)\nper task: {results_path}\n"
    )
    for row in rows:
        if row["state"] != "succeeded" or row["reward"] is None:
            out.write(f"first problem: task {row['task']}: {row['state']}: {row['error'] or 'no reward posted'}\n")
            break
    return (FAILURE if failed == len(rows) else 0), output
