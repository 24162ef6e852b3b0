"""`make demo`: AGL training a model, end to end on one machine, offline.

1. Generates addition tasks for the unmodified math agent (examples/math_agent) and a held-out set.
2. Makes a tiny Qwen2-shaped model here (a tokenizer learned from the task text, ~1 M parameters) and
   warm-starts it with a short supervised run; cached under data/models by its recipe.
3. Runs `agl train` (services/cli/train) with the example's settings, so the demo and the command cannot drift:
   the services of deploy/docker-compose.yaml as local processes (ledger, proxy, controller, the CPU vLLM engine
   serving the model, the console), a smoke rollout, then the real trainer (`agl-trainer placement=cpu`: verl's
   actor on CPU, GRPO) for --steps steps: every rollout is the agent process calling the model through the proxy
   and posting its reward.
4. Prints one line per step, then the held-out accuracy before and after, and writes the reward curve (PNG),
   the per-step metrics, the trajectories with decoded text and the trained model under --output-dir.

Everything it started is stopped on exit, on Ctrl-C and on SIGTERM. Each demo run is a new run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shutil
import signal
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from services.cli.train import plan as train_plan  # noqa: E402
from services.cli.train import session  # noqa: E402
from services.cli.train.options import non_negative_float  # noqa: E402
from tools.demo_agents import AGENTS, DemoAgent  # noqa: E402

MATH_AGENT = AGENTS["math"].agent_class
# The agents read their task from these variables (see examples/math_agent/agent.py, examples/calc_agent/agent.py).
TASK_ENV = {"AGL_TASK_QUESTION": "input.question", "AGL_TASK_ANSWER": "input.answer"}
# 3: the tiny tokenizer has the tool-call tokens and its template renders tools. 4: the start's quality is
# measured and kept in the model folder (services/engine/start_quality.py). 5: built on one thread (BUILD_THREADS).
WARM_START_VERSION = 5
# The warm start and its quality measure run on one torch thread, whatever the machine's load. The thread count
# changes the float rounding and so the model: the math recipe gave held-out 0.281 built on 1 thread and 0.203 on
# 2 (2026-12-07, the same machine), and GRPO's result depends on the start. Chosen by load, as before, the same
# clone built different starts on a quiet and on a busy machine (and could change threads mid-build). One thread
# costs 61 s against 45 s on a quiet 2-core machine, and is what a loaded one chose anyway.
BUILD_THREADS = 1
# Held-out tasks a warm start's quality is measured on (start_held_out).
START_HELD_OUT = 64
# Checkpoints of the ~1 M-parameter model take ~0.1 s and 12 MB each.
DEMO_SAVE_EVERY = 10


GROUP_TITLE = "training (the default)"


def lora_rank(text: str) -> int:
    try:
        rank = int(text)
    except ValueError:
        rank = -1
    if rank < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a LoRA rank is a whole number above 0 (0: every weight trains)")
    return rank


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(GROUP_TITLE)
    group.add_argument(
        "--agent",
        choices=sorted(AGENTS),
        default="math",
        help="math: the single-turn math agent on additions; calc: the multi-turn calc agent (a calculator tool) "
        "on 2-digit products",
    )
    group.add_argument("--steps", type=int, default=60, help="GRPO steps")
    group.add_argument("--tasks-per-step", type=int, default=16, help="tasks per step (GRPO groups)")
    group.add_argument(
        "--lr", type=float, default=None, help="actor learning rate (1e-4; 1e-3 with --lora; 0: a control run)"
    )
    group.add_argument("--lr-warmup-steps", type=int, default=10, help="optimizer steps of linear lr warm-up")
    # No KL loss by default: in the recipe lab (math, 16 x 4, lr 1e-4, 60 steps) KL 0.1 rose +0.20 to +0.31 over ten
    # seeds against +0.17 to +0.30 without, but through the whole stack one of its three math runs gave back late
    # as runs without it do (+0.125 after 0.531 at step 40): docs/getting-started/demo.md, the recipe.
    group.add_argument(
        "--kl-coef",
        type=non_negative_float,
        default=0.0,
        help="KL loss to the warm start (verl's kl_loss_coef, low_var_kl; 0: none)",
    )
    group.add_argument("--mini-batches", type=int, default=1, help="optimizer updates per step (tasks split)")
    group.add_argument("--train-tasks", type=int, default=None, help="training tasks generated (math 336, calc 2000)")
    group.add_argument("--val-tasks", type=int, default=64, help="held-out tasks (greedy accuracy)")
    group.add_argument(
        "--warm-start-steps",
        type=int,
        default=None,
        help="supervised warm-start steps (math 300; calc at most 800: it stops once right on a fifth of a probe)",
    )
    group.add_argument("--max-operand", type=int, default=None, help="math: tasks add two numbers in 0..N (19)")
    group.add_argument("--val-every", type=int, default=20, help="held-out accuracy every N steps (0: at the end)")
    group.add_argument(
        "--start-only",
        action="store_true",
        help="build (or reuse) the warm start, print its measured quality and stop: exit 1 when the starting-point "
        "rules refuse it",
    )
    group.add_argument(
        "--any-start",
        action="store_true",
        help="train even from a warm start the starting-point rules refuse (its figures are still printed): for "
        "tests of the data path with a deliberately short warm start",
    )
    group.add_argument(
        "--lora",
        type=lora_rank,
        default=0,
        metavar="RANK",
        help="train a LoRA adapter of this rank (alpha 2 x rank) instead of every weight: the engine serves it, "
        "the run ends with adapter/ (PEFT) and model/ (merged); 0: full fine-tuning",
    )


# -- data and model -----------------------------------------------------------------------------------------


def resolve_agent_defaults(args: argparse.Namespace) -> DemoAgent:
    """The chosen agent, with its defaults filled into the options left unset; options the agent does not use
    are refused (SystemExit with the reason)."""
    agent = AGENTS[args.agent]
    if args.start_only and args.any_start:
        raise SystemExit("--any-start lets a refused start train; --start-only trains nothing: give one of them")
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
    *,
    held_out: Sequence[dict[str, Any]],
    refuse: bool = True,
) -> Path:
    """The warm-started tiny model, made once per recipe (agent, tasks, sizes, steps) and reused after. Its
    starting quality is measured once, on held_out and a sample of train, and kept in the model folder; a start
    GRPO cannot learn from is refused (SystemExit with the figure and the rule) unless refuse is False."""
    from services.engine import start_quality
    from services.engine.tiny_model import RECIPE_FILE, build_tiny_model
    from services.engine.warm_start import progress_lines, warm_start

    examples = agent.warm_examples(train)
    recipe = {
        "version": WARM_START_VERSION,
        "agent": agent.name,
        "hidden": 128,
        "layers": 4,
        "warm_steps": warm_steps,
        "warm_lr": agent.warm_lr,
        "warm_stop_accuracy": agent.warm_stop_accuracy,
        "warm_stop_below": agent.warm_stop_below,
        "warm_min_steps": agent.warm_min_steps,
        "warm_examples": examples,
        "tasks": train,
    }
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    path = models_dir / f"tiny-{agent.name}-{digest}"
    quality = start_quality.recorded(path)
    if quality is not None and json.loads((path / RECIPE_FILE).read_text()).get("warm_start"):
        out.write(f"model: {path} (cached)\n")
    else:
        partial = path.with_name(path.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        started = time.monotonic()
        build_tiny_model(partial, hidden=128, layers=4, corpus=agent.corpus(train))
        out.write(f"model: warm-starting a tiny model on {len(train)} tasks ({warm_steps} supervised steps)...\n")
        out.flush()
        result = warm_start(
            partial,
            examples,
            steps=warm_steps,
            lr=agent.warm_lr,
            tools=agent.tools,
            threads=BUILD_THREADS,
            probe=warm_probe(agent, train, out),
            stop_band=(agent.warm_stop_accuracy or 0.0, agent.warm_stop_below),
            min_steps=agent.warm_min_steps,
            on_step=progress_lines(out, "model: warm start", warm_steps, may_stop=agent.warm_stop_accuracy is not None),
        )
        out.write(
            f"model: warm start {result.steps} steps in {result.seconds:.0f}s (loss {result.loss:.3f}); "
            "measuring the start...\n"
        )
        out.flush()
        quality = start_quality.measure(partial, agent.loop, held_out, train, threads=BUILD_THREADS)
        start_quality.record(partial, quality)
        shutil.rmtree(path, ignore_errors=True)
        partial.rename(path)
        out.write(f"model: {path} in {time.monotonic() - started:.0f}s\n")
    out.write(f"model: start {describe_start(quality)}\n")
    refused = start_quality.refusal(quality)
    if refused and refuse:
        raise SystemExit(
            f"the warm start {path.name} cannot learn: {refused} (more --warm-start-steps; --any-start trains anyway)"
        )
    return path


def warm_probe(agent: DemoAgent, train: Sequence[dict[str, Any]], out: TextIO) -> Any:
    """The agent's early stop for its warm start (None: it runs its steps): greedy accuracy on a probe of 64
    training tasks (never the held-out ones), each check printed."""
    if agent.warm_stop_accuracy is None:
        return None
    from services.engine.start_quality import greedy_accuracy

    probe = random.Random(5).sample(list(train), min(64, len(train)))
    band = f"stops within {agent.warm_stop_accuracy}-{agent.warm_stop_below}"

    def accuracy(model: Any, tokenizer: Any, step: int) -> float:
        score = greedy_accuracy(model, tokenizer, agent.loop, probe)
        out.write(f"model: step {step}: probe accuracy {score:.3f} ({band})\n")
        out.flush()
        return score

    return accuracy


def start_held_out(args: argparse.Namespace, agent: DemoAgent) -> list[dict[str, Any]]:
    """The held-out tasks a start is measured on: the agent's first START_HELD_OUT, whatever --val-tasks says, so
    the figures kept with a cached model do not depend on the run that made it."""
    return agent.make_tasks(argparse.Namespace(**{**vars(args), "val_tasks": START_HELD_OUT}))[1]


def describe_start(quality: Any) -> str:
    """One line of a start's figures (services/engine/start_quality.py)."""
    line = f"held-out accuracy {quality.held_out_accuracy:.3f}"
    if quality.tool_call_rate is not None:
        line += f", tool-call rate {quality.tool_call_rate:.2f}"
    return line + (
        f", mixed-reward groups {quality.mixed_group_share:.2f} of {quality.groups} "
        f"(sampled reward {quality.sampled_reward:.3f})"
    )


# -- the run ------------------------------------------------------------------------------------------------

# What one demo run leaves in its output folder; the next demo run starts afresh (a new run, not a resume).
RUN_PARTS = ("run.json", "stack", "state", "checkpoints", "logs", "model", "key", "metrics.jsonl", "trajectories.jsonl")


def clear_previous_run(output_dir: Path) -> None:
    """Removes an earlier demo run's files from output_dir; a folder holding anything else is refused."""
    record = train_plan.read_run_file(output_dir)
    if record is None:
        return
    if not str(record.get("run_id", "")).startswith("demo-"):
        raise SystemExit(f"{output_dir} holds run {record.get('run_id')} of agl train; choose another --output-dir")
    for name in RUN_PARTS:
        path = output_dir / name
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


# The actor's learning rates: every weight, and a LoRA adapter (ten times it, as agl train's default does: only the
# adapter moves, from B = 0). Measured from the math start (held-out 0.250, 60 steps): --lora 8 at 1e-4 reached
# 0.375 (+0.125); at 1e-3 0.484 (+0.234), as full fine-tuning at 1e-4 (docs/getting-started/demo.md).
FULL_LR, LORA_LR = 1e-4, 1e-3


# Rollouts per task (the GRPO group) when --group-size is not given. 8 for math with every weight training: from
# two math starts (the recipe lab, 60 steps, 6 seeds each) 16 x 8 rose +0.195 and +0.161 on average against +0.125
# and +0.117 for 16 x 4, with 1-2 seeds of 6 under +0.15 against 4 of 6; through the stack, from one start, +0.172
# against +0.016, at about twice the step time (5.7 s against 2.8 s). --lora and calc keep 4, their measured recipes.
FULL_MATH_GROUP_SIZE, GROUP_SIZE = 8, 4


def group_size(args: argparse.Namespace, agent: DemoAgent) -> int:
    if args.group_size is not None:
        return int(args.group_size)
    return FULL_MATH_GROUP_SIZE if agent.name == "math" and not args.lora else GROUP_SIZE


def kl_overrides(kl_coef: float) -> list[str]:
    """verl's KL loss to the reference (the warm start; with --lora, the base under the adapter), or none for 0."""
    if kl_coef <= 0:
        return []
    actor = "actor_rollout_ref.actor"
    return [f"{actor}.use_kl_loss=true", f"{actor}.kl_loss_coef={kl_coef}", f"{actor}.kl_loss_type=low_var_kl"]


def actor_lr(args: argparse.Namespace) -> float:
    if args.lr is not None:
        return float(args.lr)
    return LORA_LR if args.lora else FULL_LR


def demo_plan(
    args: argparse.Namespace,
    agent: DemoAgent,
    model_path: Path,
    train_file: Path,
    val_file: Path,
    train: list[dict[str, Any]],
) -> session.TrainPlan:
    """`agl train` with the example's settings: the agent, its generated tasks, its row limits and timeout."""
    return session.TrainPlan(
        run_id=f"demo-{uuid.uuid4().hex[:8]}",
        output=args.output_dir.resolve(),
        train_file=train_file,
        val_file=val_file,
        tasks=train,
        agent_class=agent.agent_class,
        command=(),
        env_map=dict(TASK_ENV),
        model=str(model_path),
        placement="cpu",
        steps=args.steps,
        tasks_per_step=args.tasks_per_step,
        group_size=group_size(args, agent),
        lr=actor_lr(args),
        val_every=args.val_every if args.val_every > 0 else args.steps,
        save_every=DEMO_SAVE_EVERY,
        rollout_timeout=float(agent.timeout_s),
        max_prompt_length=agent.max_prompt_length,
        max_response_length=agent.response_length,
        export_dtype="trained",
        tool_call_parser="hermes",
        resume=False,
        # A control run (--lr 0) has no learning by design; any other run without a signal fails, as agl train does.
        allow_no_learning=actor_lr(args) == 0,
        extra_overrides=[
            f"agl.val_max_samples={args.val_tasks}",
            "agl.retention.keep_steps=-1",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={max(1, args.tasks_per_step // max(1, args.mini_batches))}",
            f"actor_rollout_ref.actor.optim.lr_warmup_steps={args.lr_warmup_steps}",
            *kl_overrides(args.kl_coef),
        ],
        val_label="held-out accuracy",
        multi_turn=agent.tools is not None,
        # model/ stays what the demo leaves (the adapter merged into the base), adapter/ comes beside it.
        lora_rank=args.lora,
        lora_alpha=2 * args.lora,
        merge_adapter=args.lora > 0,
        # The start was measured already, on 64 held-out tasks and 64 sampled groups (prepare_model): more than the
        # pre-flight's few groups see.
        preflight=False,
    )


def run_training(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    output_dir = args.output_dir.resolve()
    output_dir.mkdir(parents=True, exist_ok=True)
    clear_previous_run(output_dir)
    agent = resolve_agent_defaults(args)
    train_file, val_file, train = prepare_tasks(args.data_dir.resolve(), args, agent)
    held_out = start_held_out(args, agent)
    model_path = prepare_model(
        args.data_dir.resolve() / "models",
        train,
        args.warm_start_steps,
        out,
        agent,
        held_out=held_out,
        refuse=not args.any_start,
    )
    if args.start_only:
        return 0
    plan = demo_plan(args, agent, model_path, train_file, val_file, train)
    return session.train(plan, out, base_model=model_path)


def stop_on_sigterm() -> None:
    """SIGTERM (e.g. from `timeout`) unwinds like Ctrl-C, so every context manager stops what it started. Ctrl-C
    itself is made to work even where the demo was started with SIGINT ignored (a shell starts background jobs
    so, and Python then keeps it ignored): SIGINT to its process group stopped nothing, the run went on to the end.

    SIGTERM is passed on as SIGINT rather than raising KeyboardInterrupt itself: inside asyncio.run a raise lands in
    whichever task the signal interrupts (the quick run's terminal-stream reader), that task keeps the exception
    and asyncio prints its traceback at shutdown. asyncio.run's own SIGINT handler cancels the main task instead
    and raises KeyboardInterrupt once the loop has unwound; outside a loop SIGINT raises it as usual."""

    def handler(signum: int, frame: Any) -> None:
        signal.raise_signal(signal.SIGINT)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)
