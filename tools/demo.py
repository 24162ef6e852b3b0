"""`make demo`: the main job end to end on one machine, offline.

By default it trains: the unmodified math agent, through the controller, the proxy and a CPU vLLM engine,
with the real trainer (verl's actor on CPU) for --steps GRPO steps; see tools/demo_train.py.

--quick: the 20-second collection run instead, with the vLLM-shaped stand-in engine and no training. It
starts the services of deploy/docker-compose.yaml as local processes with the compose commands and
environment (services/stack/local_stack.py), registers the engine, runs a small dataset through the math agent in
GRPO groups (every task `--group-size` times, one group label per task) with live progress, consumes the
terminal stream, writes the trajectories as JSONL, prints a summary, deletes the consumed rollouts and stops
everything it started.

    .venv/bin/python tools/demo.py [--steps 30] [--lr 5e-4]
    .venv/bin/python tools/demo.py --quick [--samples 4] [--group-size 4] [--engine-url http://host:8000/v1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import httpx

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from services._gen.agl.v1 import ledger_service_pb2, model_pb2, rollout_pb2  # noqa: E402
from services.cli.train.collect import (  # noqa: E402
    STATE_NAMES,
    attach_proxy_warnings,
    consume_terminal,
    failure_line,
)
from services.cli.train.options import positive_float, positive_int  # noqa: E402
from services.client import LedgerClient  # noqa: E402
from services.stack import local_stack  # noqa: E402
from tools import demo_train  # noqa: E402

DEMO_LABEL = "agl-demo"
MATH_AGENT = "examples.math_agent.agent:MathAgent"
TASK_ENV = {"AGL_TASK_QUESTION": "input.question", "AGL_TASK_ANSWER": "input.answer"}


# --quick's rollouts per task when --group-size is not given (training's default: tools/demo_train.group_size).
QUICK_GROUP_SIZE = 4
# Options only one mode uses; given to the other mode they are refused, never ignored.
QUICK_ONLY = ("--dataset", "--agent-class", "--samples", "--engine-url", "--rollout-timeout", "--deadline", "--quiet")


def given(argv: Sequence[str], options: Sequence[str]) -> list[str]:
    return [name for name in options if any(arg == name or arg.startswith(name + "=") for arg in argv)]


def check_mode_options(argv: Sequence[str], parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """SystemExit(2) naming an option the chosen mode does not use."""
    if args.quick:
        training = [
            name
            for group in parser._action_groups
            if group.title == demo_train.GROUP_TITLE
            for action in group._group_actions
            for name in action.option_strings
        ]
        extra = [name for name in given(argv, training) if name != "--agent"]
        if extra:
            parser.error(f"{', '.join(extra)}: training options; --quick collects rollouts and trains nothing")
        return
    extra = given(argv, QUICK_ONLY)
    if os.environ.get("ENGINE_URL") and "--engine-url" not in extra:
        extra.append("ENGINE_URL")
    if extra:
        parser.error(
            f"{', '.join(extra)}: used by --quick only; the training demo serves the model it trains. To train your "
            "own agent on your own tasks: agl train --agent-class pkg.mod:Agent --data tasks.jsonl "
            "(docs/getting-started/train-your-agent.md)"
        )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="demo", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--dataset", type=Path, default=REPO_ROOT / "examples" / "data" / "math.jsonl")
    parser.add_argument("--agent-class", default=MATH_AGENT, help="agent class the controller runs")
    parser.add_argument("--samples", type=positive_int, default=4, help="tasks taken from the dataset")
    parser.add_argument(
        "--group-size",
        type=positive_int,
        default=None,
        help="rollouts per task (GRPO group size; 4 with --quick, training: 8 for math, 4 with --lora or calc)",
    )
    parser.add_argument("--engine-url", default=os.environ.get("ENGINE_URL", ""), help="real engine (ENGINE_URL)")
    parser.add_argument("--data-dir", type=Path, default=Path("data"), help="ledger store and service logs")
    parser.add_argument("--output-dir", type=Path, default=Path("demo-output"), help="trajectory JSONL files")
    parser.add_argument("--rollout-timeout", type=positive_float, default=60.0, help="seconds per rollout")
    parser.add_argument("--deadline", type=positive_float, default=300.0, help="seconds for the whole run")
    parser.add_argument("--quiet", action="store_true", help="no live progress lines")
    parser.add_argument("--quick", action="store_true", help="stand-in engine, collection only (no training)")
    demo_train.add_arguments(parser)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    check_mode_options(argv, parser, args)
    return args


def load_tasks(path: Path, count: int, required: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The first `count` tasks of a JSONL file, every line checked: errors name the file and the line."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SystemExit(f"dataset {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise SystemExit(f"dataset {path}: cannot be read: {err}") from None
    tasks: list[dict[str, Any]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            task = json.loads(line)
        except ValueError as err:
            raise SystemExit(f"dataset {path}, line {number}: not valid JSON: {err}") from None
        if not isinstance(task, dict):
            raise SystemExit(f"dataset {path}, line {number}: a task must be a JSON object, got {type(task).__name__}")
        missing = [name for name in required if name not in task]
        if missing:
            raise SystemExit(f"dataset {path}, line {number}: the task has no {', '.join(map(repr, missing))}")
        tasks.append(task)
    if not tasks:
        raise SystemExit(f"dataset {path}: no tasks")
    return tasks[:count]


def task_fields() -> list[str]:
    """The input fields every task must have: the ones TASK_ENV hands to the agent."""
    return [path.split(".", 1)[1] for path in TASK_ENV.values() if path.startswith("input.")]


def rollout_specs(
    tasks: Sequence[Mapping[str, Any]], group_size: int, run_id: str, agent_class: str, timeout_s: float
) -> list[rollout_pb2.RolloutSpec]:
    """`group_size` rollouts per task, ids pre-assigned (create is then safe to retry), one group label per task."""
    specs = []
    for index, task in enumerate(tasks):
        group = f"g{index}"
        for sample in range(group_size):
            labels = {"app": DEMO_LABEL, "run": run_id, "group": group, "sample": str(sample)}
            specs.append(
                rollout_pb2.RolloutSpec(
                    rollout_id=f"{run_id}-{group}-{sample}",
                    input_json=json.dumps(dict(task)),
                    is_train=True,
                    config=rollout_pb2.RolloutConfig(
                        timeout_seconds=timeout_s,
                        local=rollout_pb2.LocalLaunchConfig(agent_class=agent_class, env_map=TASK_ENV),
                    ),
                    metadata=rollout_pb2.RolloutMetadata(labels=labels),
                )
            )
    return specs


class Progress:
    """Counts rollouts of the run by state from the rollout watch and prints a line when the counts change."""

    def __init__(self, total: int, out: TextIO, quiet: bool) -> None:
        self.total, self.out, self.quiet = total, out, quiet
        self.states: dict[str, str] = {}
        self.started = time.monotonic()
        self._last = ""
        self.tty = out.isatty()

    def update(self, rollout_id: str, state: int) -> None:
        self.states[rollout_id] = STATE_NAMES.get(state, "other")
        if self.tty:
            self.show()

    def line(self) -> str:
        counts = Counter(self.states.values())
        parts = " ".join(f"{name} {counts.get(name, 0):>3}" for name in ("queued", "running", "succeeded", "failed"))
        return f"[{time.monotonic() - self.started:6.1f}s] {parts}   (of {self.total})"

    def show(self, final: bool = False) -> None:
        """Writes the counts when they changed: on a terminal by rewriting one line, elsewhere as a new line."""
        text = self.line()
        counts = text.split("]", 1)[1]
        if self.quiet or (counts == self._last and not final):
            return
        self._last = counts
        end = "\n" if final or not self.tty else ""
        self.out.write(("\r" if self.tty else "") + text + end)
        self.out.flush()


async def watch_progress(client: LedgerClient, run_id: str, progress: Progress) -> None:
    """Feeds the rollout watch into progress; off a terminal, a line per second at most (when counts changed)."""

    async def tick() -> None:
        while True:
            await asyncio.sleep(1.0)
            progress.show()

    ticker = None if progress.tty else asyncio.create_task(tick())
    try:
        async for change in client.watch_rollouts(labels={"run": run_id}):
            if change.rollout.rollout_id and change.type != ledger_service_pb2.ROLLOUT_CHANGE_TYPE_DELETE:
                progress.update(change.rollout.rollout_id, change.rollout.status.state)
    finally:
        if ticker is not None:
            ticker.cancel()


async def run_job(args: argparse.Namespace, ledger_address: str, key: str, model_name: str, engine_url: str) -> int:
    """Registers the engine, enqueues the groups, follows them to the end, writes and summarizes. Exit code."""
    run_id = f"demo-{uuid.uuid4().hex[:8]}"
    tasks = load_tasks(args.dataset, args.samples, task_fields())
    group_size = args.group_size or QUICK_GROUP_SIZE
    specs = rollout_specs(tasks, group_size, run_id, args.agent_class, args.rollout_timeout)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    output = args.output_dir / f"{run_id}.jsonl"
    async with LedgerClient(ledger_address, key=key or None) as client:
        stale = await client.list_rollouts(labels={"app": DEMO_LABEL})
        if stale:
            await client.delete_rollouts([r.rollout_id for r in stale])
            print(f"removed {len(stale)} rollouts left by an earlier demo run")
        # The store outlives runs: endpoints an earlier run registered (a stand-in on another port) are gone.
        await client.delete_models([model_pb2.ModelEndpointKey(model_name=model_name)])
        await client.register_models([model_pb2.ModelEndpoint(model_name=model_name, endpoint=engine_url)])
        print(f"engine {engine_url} registered as {model_name!r}")
        await client.create_rollouts(specs)
        print(f"run {run_id}: {len(tasks)} tasks x {group_size} samples = {len(specs)} rollouts queued")
        progress = Progress(len(specs), sys.stdout, args.quiet)
        watcher = asyncio.create_task(watch_progress(client, run_id, progress))
        try:
            with open(output, "w") as sink:

                def write(record: dict[str, Any]) -> None:
                    sink.write(json.dumps(record) + "\n")
                    sink.flush()

                waiting = consume_terminal(client, {"run": run_id}, len(specs), write)
                records = await asyncio.wait_for(waiting, args.deadline)
        except asyncio.TimeoutError:
            progress.show(final=True)
            print(f"deadline of {args.deadline:.0f}s passed before every rollout ended", file=sys.stderr)
            return 1
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        for record in records:
            progress.states[record["rollout_id"]] = record["state"]
        progress.show(final=True)
        await attach_proxy_warnings(client, records)
        deleted = await client.delete_rollouts([record["rollout_id"] for record in records])
    print_summary(run_id, records, output, deleted)
    return 0 if all(record["state"] == "succeeded" for record in records) else 1


def print_summary(run_id: str, records: Sequence[Mapping[str, Any]], output: Path, deleted: int) -> None:
    states = Counter(record["state"] for record in records)
    by_group: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for record in records:
        by_group[record["group"]].append(record)
    calls = [call for record in records for call in record["calls"]]
    print(f"\n== summary of {run_id} ==")
    print("rollouts: " + ", ".join(f"{state} {count}" for state, count in sorted(states.items())))
    print(f"{'group':<6} {'task':<10} {'question':<28} {'rewards':<20} mean")
    for group in sorted(by_group, key=lambda name: int(name[1:]) if name[1:].isdigit() else 0):
        items = sorted(by_group[group], key=lambda record: record["rollout_id"])
        task = items[0]["input"] or {}
        rewards = [record["reward"] for record in items]
        known = [reward for reward in rewards if reward is not None]
        mean = f"{sum(known) / len(known):.2f}" if known else "-"
        shown = " ".join("-" if reward is None else f"{reward:g}" for reward in rewards)
        print(f"{group:<6} {task.get('id', ''):<10} {task.get('question', '')[:28]:<28} {shown:<20} {mean}")
    prompt_tokens = sum(len(call["prompt_token_ids"]) for call in calls)
    response_tokens = sum(len(call["response_token_ids"]) for call in calls)
    print(f"model calls captured: {len(calls)} (prompt tokens {prompt_tokens}, response tokens {response_tokens})")
    for record in records:
        line = failure_line(record)
        if line:
            print("  " + line)
    print(f"trajectories: {output}")
    print(f"deleted {deleted} consumed rollouts from the ledger")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    demo_train.stop_on_sigterm()
    try:
        return run_quick(args) if args.quick else demo_train.run_training(args)
    except KeyboardInterrupt:
        print("\ninterrupted: everything the demo started has been stopped", file=sys.stderr)
        return 130


def check_engine(url: str, api_key: str = "", timeout_s: float = 10.0) -> str | None:
    """One GET {url}/models before anything starts or is queued: why the engine is unusable, or None."""
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    models_url = url.rstrip("/") + "/models"
    try:
        reply = httpx.get(models_url, headers=headers, timeout=timeout_s)
    except httpx.HTTPError as err:
        return f"the engine at {url} does not answer GET {models_url}: {err or type(err).__name__}"
    if reply.status_code != 200:
        return f"the engine at {url} answered GET {models_url} with HTTP {reply.status_code}: {reply.text[:200]}"
    try:
        names = [str(card["id"]) for card in reply.json()["data"]]
    except (ValueError, KeyError, TypeError):
        return f"the engine at {url} answered GET {models_url} with something other than an OpenAI model list"
    if not names:
        return f"the engine at {url} serves no model"
    return None


def run_quick(args: argparse.Namespace) -> int:
    # Everything the user gave is checked before any service starts.
    if args.agent != "math":
        print(
            f"--agent {args.agent} picks the agent the training run trains; --quick collects with --agent-class "
            "and --dataset (e.g. --agent-class examples.calc_agent.agent:CalcAgent --dataset examples/data/calc.jsonl)",
            file=sys.stderr,
        )
        return 2
    load_tasks(args.dataset, args.samples, task_fields())
    if args.engine_url:
        problem = check_engine(args.engine_url, os.environ.get("AGL_ENGINE_API_KEY", ""))
        if problem:
            print(f"{problem}; nothing was started (check --engine-url / ENGINE_URL)", file=sys.stderr)
            return 2
    # The toy model errs on a quarter of its sampled answers so that GRPO groups get rewards that differ.
    variables = {"AGL_STANDIN_MISTAKE_RATE": "0.25", **os.environ}
    profiles = [] if args.engine_url else ["standin"]
    specs = local_stack.load_compose(variables, profiles)
    wanted = ["ledger", "proxy", "controller"] + ([] if args.engine_url else ["standin"])
    specs = {name: specs[name] for name in wanted}
    data_dir = args.data_dir.resolve()
    logs = data_dir / "logs"
    overrides = {"controller": {"AGL_CONTROLLER_LOG_DIR": str(logs / "agents")}}
    plans = local_stack.localize(specs, data_dir, overrides)
    print(f"starting {', '.join(wanted)} (logs in {logs})")
    with local_stack.run_stack(plans, local_stack.start_order(specs), logs) as running:
        ledger = running["ledger"].address(int(specs["ledger"].env["AGL_LEDGER_PORT"]))
        model_name = specs["proxy"].env["AGL_MODEL_NAME"]
        if args.engine_url:
            engine_url = args.engine_url
        else:
            engine_url = "http://{}/v1".format(
                running["standin"].address(int(specs["standin"].env["AGL_STANDIN_PORT"]))
            )
        key = specs["ledger"].env.get("AGL_KEY", "")
        code = asyncio.run(run_job(args, ledger, key, model_name, engine_url))
        print("stopping the services")
    return code


if __name__ == "__main__":
    sys.exit(main())
