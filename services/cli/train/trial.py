"""`agl try`: the agent on the first few tasks, through the whole local stack on the stand-in engine, in seconds.

The agent's options and their checks are agl train's (plan.agent_plan), so a mistake `agl try` passes cannot stop
`agl train`'s checks, and one it reports is the one `agl train` would meet minutes later. Guarantee: the exit
code is 0 only when every rollout succeeded with a reward and made at least one model call; every problem is one
line naming the rollout and its agent log. What training would take from each rollout is counted by the trainer's
own data path (trainer/data/triplets.py and aggregation.py, pure, without verl), at agl train's row limits.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from services.trainer.data.aggregation import rows_from_trace
from services.trainer.data.settings import DataPathSettings
from services.trainer.data.triplets import call_text, trace_from_events

from ..errors import FAILURE, CliError
from . import collect, options
from .checks import agent_import_path
from .plan import KNOWN as TRAIN_OPTIONS
from .plan import AgentPlan, agent_plan
from .session import agent_log, run_interruptible
from .signals import run_async
from .stack import Stack, running_stack

TRY_LABEL = "agl_try"
TEXT_CHARS = 100  # of a prompt's end and of an answer, as shown
# Options of `agl try` itself; any other key of agl train's --config file is a training option it leaves alone.
TRY_OPTIONS = ("data", "tasks", "model", "agent_class", "command", "env_map", "rollout_timeout", "max_prompt_length",
               "max_response_length")  # fmt: skip


def short(text: str, limit: int = TEXT_CHARS, *, tail: bool = False) -> str:
    """text on one line, at most limit characters: its start, or its end (a prompt's end is its newest message)."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    return "..." + flat[3 - limit :] if tail else flat[: limit - 3] + "..."


def rollout_view(record: Mapping[str, Any], events: Sequence[Any], agent: AgentPlan) -> dict[str, Any]:
    """The rollout's calls as text and the rows training would take from it (with the counts of what the limits
    dropped or cut)."""
    counts: Counter[str] = Counter()
    trace = trace_from_events(record["rollout_id"], record["group"], "", events, reward_fillna_value=0.0, counts=counts)
    rows = rows_from_trace(
        trace,
        DataPathSettings().level,
        max_prompt_length=agent.max_prompt_length,
        max_response_length=agent.max_response_length,
        counts=counts,
    )
    texts = [call_text(event.model_request) for event in events if event.WhichOneof("payload") == "model_request"]
    return {
        "calls": texts,
        "rows": len(rows),
        "prompt_tokens": sum(len(row.prompt_ids) for row in rows),
        "response_tokens": sum(sum(row.response_mask) for row in rows),
        "limits": {name: count for name, count in counts.items() if count and name != "reward_missing"},
    }


def show_rollout(index: int, record: Mapping[str, Any], view: Mapping[str, Any], out: TextIO) -> None:
    reward = "none" if record["reward"] is None else f"{record['reward']:g}"
    out.write(f"task {index + 1} ({record['rollout_id']}): {record['state']}, reward {reward}, ")
    out.write(f"{len(view['calls'])} model call(s)\n")
    for number, call in enumerate(view["calls"], start=1):
        tokens = f"{call.prompt_tokens} + {call.response_tokens} tokens"
        out.write(f"  call {number}: {short(call.prompt, tail=True)!r}\n")
        out.write(f"       -> {short(call.response)!r} ({tokens}{'' if call.ok else ', FAILED'})\n")
    trained = f"  would train: {view['rows']} row(s), {view['prompt_tokens']} prompt + {view['response_tokens']} "
    trained += "response tokens"
    if view["limits"]:
        trained += " (" + ", ".join(f"{name} {count}" for name, count in sorted(view["limits"].items())) + ")"
    out.write(trained + "\n")


async def run_tasks(agent: AgentPlan, count: int, stack: Stack, try_id: str) -> list[tuple[dict[str, Any], list[Any]]]:
    """The agent on the first `count` tasks at once (train mode: token ids and log-probs recorded, as training
    records them): each rollout's record and its events, in task order; the rollouts are deleted afterwards."""
    labels = {TRY_LABEL: try_id}
    specs = [
        collect.agent_spec(agent, f"{try_id}-t{index}", task, labels, is_train=True)
        for index, task in enumerate(agent.tasks[:count])
    ]
    async with stack.client() as client:
        try:
            records = await collect.run_rollouts(client, specs, labels, deadline_s=agent.rollout_timeout + 30)
        except asyncio.TimeoutError:
            raise CliError(
                f"not every rollout ended within {agent.rollout_timeout + 30:.0f}s (agent logs: {stack.agent_logs})"
            ) from None
        found = [(record, await client.list_events(record["rollout_id"])) for record in records]
        await client.delete_rollouts([spec.rollout_id for spec in specs])
    return found


def try_agent(args: argparse.Namespace, out: TextIO) -> int:
    started = time.monotonic()
    options.merge_config(args, options.TRY_DEFAULTS, (*TRAIN_OPTIONS, "tasks"))
    unused = sorted(set(args.given) - set(TRY_OPTIONS))
    agent = agent_plan(args)
    count = min(int(args.tasks), len(agent.tasks))
    try_id = f"try-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"
    folder = (options.RUNS_DIR / try_id).resolve()
    out.write(f"checks passed in {time.monotonic() - started:.1f}s: {len(agent.tasks)} tasks in {agent.data_file}, ")
    out.write(f"trying the first {count}\n")
    if unused:
        out.write(f"--config: {', '.join(unused)}: training options, used by agl train (not here)\n")
    out.flush()
    with running_stack(
        folder,
        model_dir=None,
        max_model_len=agent.max_prompt_length + agent.max_response_length,
        concurrency=count,
        agent_path=agent_import_path(),
        out=out,
        console=False,
        standin=True,
    ) as stack:
        up = time.monotonic()
        out.write(f"services up in {up - started:.1f}s (the stand-in engine answers, no model); running the agent\n")
        out.flush()
        found = run_async(run_tasks(agent, count, stack, try_id))
        took = time.monotonic() - up
        problems = []
        for index, (record, events) in enumerate(found):
            show_rollout(index, record, rollout_view(record, events, agent), out)
            problem = collect.rollout_problem(record, agent_log(stack, record["rollout_id"]))
            if problem:
                problems.append(problem)
    rewards = [record["reward"] for record, _ in found if record["reward"] is not None]
    mean = f"mean reward {sum(rewards) / len(rewards):.2f}" if rewards else "no reward"
    out.write(f"{len(found)} rollout(s) in {took:.1f}s, {mean}; logs in {folder / 'logs'}\n")
    if problems:
        more = f" (and {len(problems) - 1} more rollout(s) with a problem)" if len(problems) > 1 else ""
        out.write(f"agl try: {problems[0]}{more}\n")
        return FAILURE
    out.write("agl try: ok, every rollout succeeded with a reward; train it with agl train and the same options\n")
    return 0


def run_try_command(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    """Ctrl-C and SIGTERM stop every service it started, with one line (as agl train)."""
    return run_interruptible("try", lambda: try_agent(args, out), out)
