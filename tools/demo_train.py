"""`make demo`: AGL training a model, end to end on one machine, offline.

1. Generates addition tasks for the unmodified math agent (examples/math_agent) and a held-out set.
2. Makes a tiny Qwen2-shaped model here (a tokenizer learned from the task text, ~1 M parameters) and
   warm-starts it with a short supervised run; cached under data/models by its recipe.
3. Starts the services of deploy/docker-compose.yaml as local processes (ledger, proxy, controller and the
   CPU vLLM engine of the `engine` profile) and registers the engine in the ledger.
4. Runs the real trainer (`agl-trainer placement=cpu`: verl's actor on CPU, GRPO) for --steps steps: every
   rollout is the agent process calling the model through the proxy and posting its reward.
5. Prints one line per step, then the held-out accuracy before and after, and writes the reward curve
   (PNG), the per-step metrics and the trajectories with decoded text under --output-dir.

Everything it started is stopped on exit, on Ctrl-C and on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from deploy import local_stack  # noqa: E402
from services._gen.agl.v1 import model_pb2  # noqa: E402
from services.client import LedgerClient  # noqa: E402
from tools.demo_agents import AGENTS, DemoAgent  # noqa: E402

MATH_AGENT = AGENTS["math"].agent_class
# The agents read their task from these variables (see examples/math_agent/agent.py, examples/calc_agent/agent.py).
TASK_ENV = {"AGL_TASK_QUESTION": "input.question", "AGL_TASK_ANSWER": "input.answer"}
# 3: the tiny tokenizer has the tool-call tokens and its template renders tools.
WARM_START_VERSION = 3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("training (the default)")
    group.add_argument(
        "--agent",
        choices=sorted(AGENTS),
        default="math",
        help="math: the single-turn math agent on additions; calc: the multi-turn calc agent (a calculator tool) "
        "on 2-digit products",
    )
    group.add_argument("--steps", type=int, default=60, help="GRPO steps")
    group.add_argument("--tasks-per-step", type=int, default=16, help="tasks per step (GRPO groups)")
    group.add_argument("--lr", type=float, default=1e-4, help="actor learning rate (0: a control run)")
    group.add_argument("--lr-warmup-steps", type=int, default=10, help="optimizer steps of linear lr warm-up")
    group.add_argument("--mini-batches", type=int, default=1, help="optimizer updates per step (tasks split)")
    group.add_argument("--train-tasks", type=int, default=None, help="training tasks generated (math 336, calc 2000)")
    group.add_argument("--val-tasks", type=int, default=64, help="held-out tasks (greedy accuracy)")
    group.add_argument(
        "--warm-start-steps", type=int, default=None, help="supervised warm-start steps (math 150, calc 400)"
    )
    group.add_argument("--max-operand", type=int, default=None, help="math: tasks add two numbers in 0..N (19)")
    group.add_argument("--val-every", type=int, default=20, help="held-out accuracy every N steps (0: at the end)")


# -- data and model -----------------------------------------------------------------------------------------


def resolve_agent_defaults(args: argparse.Namespace) -> DemoAgent:
    """The chosen agent, with its defaults filled into the options left unset; options the agent does not use
    are refused (SystemExit with the reason)."""
    agent = AGENTS[args.agent]
    if agent.name != "math" and args.max_operand is not None:
        raise SystemExit(f"--max-operand sizes the math agent's additions; --agent {agent.name} does not use it")
    if args.max_operand is None:
        args.max_operand = 19
    if args.train_tasks is None:
        args.train_tasks = agent.train_tasks
    if args.warm_start_steps is None:
        args.warm_start_steps = agent.warm_steps
    return agent


def prepare_tasks(
    data_dir: Path, args: argparse.Namespace, agent: DemoAgent = AGENTS["math"]
) -> tuple[Path, Path, list[dict[str, Any]]]:
    from examples.math_agent.tasks import write_jsonl

    train, val = agent.make_tasks(args)
    tasks_dir = data_dir / "tasks" / agent.name
    return write_jsonl(tasks_dir / "train.jsonl", train), write_jsonl(tasks_dir / "val.jsonl", val), train


def prepare_model(
    models_dir: Path,
    train: Sequence[dict[str, Any]],
    warm_steps: int,
    out: TextIO,
    agent: DemoAgent = AGENTS["math"],
) -> Path:
    """The warm-started tiny model, made once per recipe (agent, tasks, sizes, steps) and reused after."""
    from services.engine.tiny_model import RECIPE_FILE, build_tiny_model
    from services.engine.warm_start import warm_start

    recipe = {
        "version": WARM_START_VERSION,
        "agent": agent.name,
        "hidden": 128,
        "layers": 4,
        "warm_steps": warm_steps,
        "warm_lr": agent.warm_lr,
        "tasks": train,
    }
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    path = models_dir / f"tiny-{agent.name}-{digest}"
    if (path / RECIPE_FILE).exists() and json.loads((path / RECIPE_FILE).read_text()).get("warm_start"):
        out.write(f"model: {path} (cached)\n")
        return path
    partial = path.with_name(path.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    started = time.monotonic()
    build_tiny_model(partial, hidden=128, layers=4, corpus=agent.corpus(train))
    out.write(f"model: warm-starting a tiny model on {len(train)} tasks ({warm_steps} supervised steps)...\n")
    out.flush()
    result = warm_start(partial, agent.warm_examples(train), steps=warm_steps, lr=agent.warm_lr, tools=agent.tools)
    shutil.rmtree(path, ignore_errors=True)
    partial.rename(path)
    out.write(f"model: {path} in {time.monotonic() - started:.0f}s (warm-start loss {result.loss:.3f})\n")
    return path


# -- the trainer --------------------------------------------------------------------------------------------


def trainer_overrides(
    args: argparse.Namespace,
    *,
    run_id: str,
    ledger: str,
    key: str,
    model_name: str,
    model_path: Path,
    train_file: Path,
    val_file: Path,
    state_dir: Path,
    output_dir: Path,
    agent: DemoAgent = AGENTS["math"],
) -> list[str]:
    overrides = [
        "placement=cpu",
        f"agl.run_id={run_id}",
        f"agl.ledger_address={ledger}",
        f"agl.model_name={model_name}",
        f"agl.launch.agent_class={agent.agent_class}",
        *(f"+agl.launch.env_map.{name}={path}" for name, path in TASK_ENV.items()),
        f"agl.launch.timeout_seconds={agent.timeout_s}",
        f"agl.state_dir={state_dir / 'manager'}",
        f"agl.engines.weights_dir={state_dir / 'weights'}",
        f"agl.trajectory_log={output_dir / 'trajectories.jsonl'}",
        f"agl.val_max_samples={args.val_tasks}",
        "agl.progress=false",
        "agl.retention.keep_steps=-1",
        f"data.train_files={train_file}",
        f"data.val_files={val_file}",
        f"data.train_batch_size={args.tasks_per_step}",
        f"data.max_prompt_length={agent.max_prompt_length}",
        f"actor_rollout_ref.rollout.n={args.group_size}",
        f"actor_rollout_ref.rollout.response_length={agent.response_length}",
        f"actor_rollout_ref.model.path={model_path}",
        f"actor_rollout_ref.actor.optim.lr={args.lr}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={max(1, args.tasks_per_step // max(1, args.mini_batches))}",
        f"actor_rollout_ref.actor.optim.lr_warmup_steps={args.lr_warmup_steps}",
        f"trainer.total_training_steps={args.steps}",
        f"trainer.test_freq={args.val_every if args.val_every > 0 else args.steps}",
        "trainer.val_before_train=true",
        "trainer.save_freq=-1",
        "trainer.logger=[console,file]",
        f"trainer.default_local_dir={state_dir / 'checkpoints'}",
    ]
    if key:
        overrides.append(f"agl.key={key}")
    return overrides


@contextlib.contextmanager
def trainer_process(argv: Sequence[str], env: Mapping[str, str], log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The trainer in its own process group (Ray's processes with it), stopped as a group on the way out."""
    with open(log_path, "ab") as log_file:
        proc = subprocess.Popen(
            list(argv), stdout=log_file, stderr=subprocess.STDOUT, env=dict(env), cwd=REPO_ROOT, start_new_session=True
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=20)
        # Ray's helpers share the group and may outlive the driver: nothing of the run stays behind.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def read_metrics(path: Path, offset: int) -> tuple[list[dict[str, Any]], int]:
    """Complete JSON lines appended to verl's file logger since offset."""
    if not path.exists():
        return [], offset
    with path.open("rb") as source:
        source.seek(offset)
        chunk = source.read()
    end = chunk.rfind(b"\n") + 1
    records = [json.loads(line) for line in chunk[:end].splitlines() if line.strip()]
    return records, offset + end


def step_line(record: Mapping[str, Any], total: int, *, multi_turn: bool = False) -> str:
    """One line per step; for a multi-turn agent a second one with what its rollouts did: turns, tool calls
    (and those that did not parse), trajectory breaks and the context tokens masked in each row."""
    data = record["data"]
    step = record["step"]

    def num(key: str, fmt: str = ".2f") -> str:
        value = data.get(key)
        return "-" if value is None else format(float(value), fmt)

    if step == 0:
        line = f"step {0:>3}/{total}  held-out accuracy {num('val/agl/reward_mean')} (before training)"
        if multi_turn:
            line += f", tool-call rate {num('val/agl/tools/call_rate')}"
        return line
    line = (
        f"step {step:>3}/{total}  reward {num('agl/reward/mean')}  "
        f"rollouts {num('timing_s/gen', '.1f')}s  update {num('timing_s/update_actor', '.2f')}s  "
        f"push {num('timing_s/update_weights', '.2f')}s  step {num('agl/step/seconds', '.1f')}s  "
        f"engine/trainer log-prob gap {num('agl/push/logprob_diff_max', '.1e')}"
    )
    if "val/agl/reward_mean" in data:
        line += f"  held-out accuracy {num('val/agl/reward_mean')}"
        if multi_turn:
            line += f" (tool-call rate {num('val/agl/tools/call_rate')})"
    if multi_turn:
        line += (
            f"\n          turns {num('agl/turns/mean')}  tool-call rate {num('agl/tools/call_rate')}"
            f"  tool calls unparsed {num('agl/tools/unparsed_calls', '.0f')}"
            f"  trajectory breaks {num('agl/data/trajectory_breaks', '.0f')}"
            f"  masked context tokens/row {num('agl/data/context_tokens_per_row', '.1f')}"
        )
    return line


# -- results ------------------------------------------------------------------------------------------------


TOOL_RATE, VAL_TOOL_RATE = "agl/tools/call_rate", "val/agl/tools/call_rate"


def draw_curve(records: Sequence[Mapping[str, Any]], path: Path, *, tools: bool = False) -> Path:
    """Training reward per step (line) and held-out accuracy (dots), drawn with Pillow; for an agent with tools
    also its tool-call rate in training (line) and on the held-out set (squares), in green."""
    from PIL import Image, ImageDraw

    width, height, margin = 720, 400, 50
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    steps = [r["step"] for r in records]
    last = max(steps, default=1) or 1

    def xy(step: float, value: float) -> tuple[float, float]:
        x = margin + (width - 2 * margin) * step / last
        y = height - margin - (height - 2 * margin) * max(0.0, min(1.0, value))
        return x, y

    draw.rectangle([margin, margin, width - margin, height - margin], outline="black")
    for tick in (0.0, 0.25, 0.5, 0.75, 1.0):
        _, y = xy(0, tick)
        draw.line([margin - 4, y, margin, y], fill="black")
        draw.text((8, y - 6), f"{tick:.2f}", fill="black")
    title = "AGL demo: training reward (blue) and held-out accuracy (red) by step"
    if tools:
        title += "; tool-call rate (green: training line, held-out squares)"
    draw.text((margin, 15), title, fill="black")
    for tick in sorted({0, last // 2, last}):
        x, _ = xy(tick, 0.0)
        draw.line([x, height - margin, x, height - margin + 4], fill="black")
        draw.text((x - 6, height - margin + 8), str(tick), fill="black")
    draw.text((width // 2 - 10, height - 22), "step", fill="black")
    train = [xy(r["step"], r["data"]["agl/reward/mean"]) for r in records if "agl/reward/mean" in r["data"]]
    if len(train) > 1:
        draw.line(train, fill=(40, 90, 200), width=2)
    for r in records:
        if "val/agl/reward_mean" in r["data"]:
            x, y = xy(r["step"], r["data"]["val/agl/reward_mean"])
            draw.ellipse([x - 5, y - 5, x + 5, y + 5], fill=(210, 40, 40))
    if tools:
        rate = [xy(r["step"], r["data"][TOOL_RATE]) for r in records if r["step"] > 0 and TOOL_RATE in r["data"]]
        if len(rate) > 1:
            draw.line(rate, fill=(30, 150, 60), width=2)
        for r in records:
            if VAL_TOOL_RATE in r["data"]:
                x, y = xy(r["step"], r["data"][VAL_TOOL_RATE])
                draw.rectangle([x - 4, y - 4, x + 4, y + 4], fill=(30, 150, 60))
    image.save(path)
    return path


def summary(
    records: Sequence[Mapping[str, Any]], output_dir: Path, out: TextIO, *, tools: bool = False
) -> dict[str, Any]:
    vals = [(r["step"], r["data"]["val/agl/reward_mean"]) for r in records if "val/agl/reward_mean" in r["data"]]
    rewards = [r["data"]["agl/reward/mean"] for r in records if "agl/reward/mean" in r["data"]]
    steps = [r["data"]["agl/step/seconds"] for r in records if "agl/step/seconds" in r["data"]]
    gaps = [r["data"]["agl/push/logprob_diff_max"] for r in records if "agl/push/logprob_diff_max" in r["data"]]
    result: dict[str, Any] = {"steps": len(rewards)}
    out.write("\n== results ==\n")
    if vals:
        before, after = vals[0][1], vals[-1][1]
        result.update(before=before, after=after)
        out.write(f"{'held-out greedy accuracy':<28}{'before':>10}{'after':>10}{'change':>10}\n")
        out.write(f"{'':<28}{before:>10.3f}{after:>10.3f}{after - before:>+10.3f}\n")
    rates = [(r["step"], r["data"][VAL_TOOL_RATE]) for r in records if VAL_TOOL_RATE in r["data"]]
    if tools and rates:
        before_rate, after_rate = rates[0][1], rates[-1][1]
        result.update(tool_rate_before=before_rate, tool_rate_after=after_rate)
        line = f"{before_rate:>10.3f}{after_rate:>10.3f}{after_rate - before_rate:>+10.3f}"
        out.write(f"{'held-out tool-call rate':<28}{line}\n")
    if rewards:
        head, tail = rewards[: max(1, len(rewards) // 5)], rewards[-max(1, len(rewards) // 5) :]
        out.write(f"training reward: first steps {sum(head) / len(head):.3f}, last steps {sum(tail) / len(tail):.3f}\n")
    if steps:
        ordered = sorted(steps)
        out.write(f"seconds per step: median {ordered[len(ordered) // 2]:.2f}, max {ordered[-1]:.2f}\n")
    if gaps:
        out.write(f"engine vs trainer log-probs after each push: max gap {max(gaps):.1e}\n")
    curve = draw_curve(records, output_dir / "reward_curve.png", tools=tools)
    out.write(f"reward curve: {curve}\nmetrics: {output_dir / 'metrics.jsonl'}\n")
    out.write(f"trajectories (decoded text): {output_dir / 'trajectories.jsonl'}\n")
    return result


# -- the run ------------------------------------------------------------------------------------------------


async def register_engine(ledger: str, key: str, model_name: str, engine_url: str) -> None:
    async with LedgerClient(ledger, key=key or None) as client:
        # The store outlives runs: endpoints an earlier run registered are gone now.
        await client.delete_models([model_pb2.ModelEndpointKey(model_name=model_name)])
        await client.register_models([model_pb2.ModelEndpoint(model_name=model_name, endpoint=engine_url)])


def follow(
    proc: subprocess.Popen[bytes], metrics_path: Path, total: int, out: TextIO, *, multi_turn: bool = False
) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    offset = 0
    while True:
        done = proc.poll() is not None
        fresh, offset = read_metrics(metrics_path, offset)
        for record in fresh:
            records.append(record)
            out.write(step_line(record, total, multi_turn=multi_turn) + "\n")
            out.flush()
        if done:
            return records
        time.sleep(0.25)


def run_training(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    data_dir = args.data_dir.resolve()
    output_dir = args.output_dir.resolve()
    output_dir.mkdir(parents=True, exist_ok=True)
    for stale in ("metrics.jsonl", "trajectories.jsonl", "reward_curve.png"):
        (output_dir / stale).unlink(missing_ok=True)
    agent = resolve_agent_defaults(args)
    train_file, val_file, train = prepare_tasks(data_dir, args, agent)
    model_path = prepare_model(data_dir / "models", train, args.warm_start_steps, out, agent)
    run_id = f"demo-{uuid.uuid4().hex[:8]}"
    state_dir = data_dir / "runs" / run_id

    # Auth on, as in production: the master key is the user's AGL_KEY or one made for this run, kept in a file
    # only the user can read (the console asks for it).
    key = os.environ.get("AGL_KEY") or secrets.token_urlsafe(18)
    key_file = data_dir / "demo-key"
    key_file.parent.mkdir(parents=True, exist_ok=True)
    key_file.touch(mode=0o600)
    key_file.chmod(0o600)
    key_file.write_text(key + "\n")
    specs = local_stack.load_compose({**os.environ, "AGL_KEY": key}, ["engine", "console"])
    wanted = ["ledger", "proxy", "controller", "engine", "console"]
    specs = {name: specs[name] for name in wanted}
    logs = data_dir / "logs"
    overrides = {
        # A whole step's rollouts at once (the compose file's 8 would run a 64-rollout step in 8 waves).
        "controller": {
            "AGL_CONTROLLER_LOG_DIR": str(logs / "agents"),
            "AGL_CONTROLLER_MAX_CONCURRENCY": str(max(8, args.tasks_per_step * args.group_size)),
        },
        "engine": {"AGL_ENGINE_MODEL_DIR": str(model_path)},
    }
    plans = local_stack.localize(specs, data_dir, overrides)
    out.write(f"starting {', '.join(wanted)} (logs in {logs}; the engine takes ~40 s)\n")
    out.flush()
    with local_stack.run_stack(plans, local_stack.start_order(specs), logs, health_timeout_s=300.0) as running:
        ledger = running["ledger"].address(int(specs["ledger"].env["AGL_LEDGER_PORT"]))
        model_name = specs["proxy"].env["AGL_MODEL_NAME"]
        engine_url = "http://{}/v1".format(running["engine"].address(int(specs["engine"].env["AGL_ENGINE_PORT"])))
        asyncio.run(register_engine(ledger, key, model_name, engine_url))
        out.write(f"engine {engine_url} registered as {model_name!r}\n")
        console = running["console"].address(int(specs["console"].env["AGL_CONSOLE_PORT"]))
        out.write(f"console: http://{console}/ (sign in with the key in {key_file}; up until the demo ends)\n")
        argv = [
            sys.executable,
            "-m",
            "services.trainer",
            *trainer_overrides(
                args,
                run_id=run_id,
                ledger=ledger,
                key=key,
                model_name=model_name,
                model_path=model_path,
                train_file=train_file,
                val_file=val_file,
                state_dir=state_dir,
                output_dir=output_dir,
                agent=agent,
            ),
        ]
        metrics_path = output_dir / "metrics.jsonl"
        env = local_stack.child_environment({"VERL_FILE_LOGGER_PATH": str(metrics_path)})
        out.write(f"run {run_id}: {args.steps} steps of {args.tasks_per_step} tasks x {args.group_size} rollouts")
        out.write(f" (trainer log: {logs / 'trainer.log'})\n")
        out.flush()
        with trainer_process(argv, env, logs / "trainer.log") as proc:
            multi_turn = agent.tools is not None
            records = follow(proc, metrics_path, args.steps, out, multi_turn=multi_turn)
            code = proc.returncode
        if code != 0:
            tail = (logs / "trainer.log").read_text(errors="replace")[-3000:]
            out.write(f"\nthe trainer exited with {code}; the end of {logs / 'trainer.log'}:\n{tail}\n")
            return 1
        summary(records, output_dir, out, tools=multi_turn)
        out.write("stopping the services\n")
    return 0


def stop_on_sigterm() -> None:
    """SIGTERM (e.g. from `timeout`) unwinds like Ctrl-C, so every context manager stops what it started. Ctrl-C
    itself is made to work even where the demo was started with SIGINT ignored (a shell starts background jobs
    so, and Python then keeps it ignored): SIGINT to its process group stopped nothing, the run went on to the end."""

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)
