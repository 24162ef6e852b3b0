"""`agl train`: checks, the services, one smoke rollout, the trainer, a line per step, the model at the end.

Everything it started stops on exit, on Ctrl-C and on SIGTERM; an interrupted run is marked failed in the
ledger with the reason (and `--resume` continues it from its last checkpoint).

The run's sequence (supervised start, stack, smoke rollout, pre-flight, trainer, export) shares one run record and
one signal-handling scope; the plan (options, checks, run file) is plan.py, the pre-flight's judgement
preflight.py, the supervised start sft.py.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from services._gen.agl.v1 import run_pb2
from services.code_root import CHECKOUT
from services.trainer.run.best import ADAPTER

from ..errors import FAILURE, USAGE, CliError
from . import (
    background,
    checks,
    collect,
    export,
    lora,
    options,
    preflight,
    prompt_fit,
    report,
    reporting,
    sft,
    trainer_args,
)
from .plan import TrainPlan, plan_from_args, unfinished_runs_like, write_run_file
from .signals import Interrupted, interrupted_by, raise_on_signals, restore_handlers, run_async
from .stack import Stack, check_services, child_environment, running_stack, while_services_run
from .trainer_args import TRAJECTORIES_FILE

METRICS_FILE = "metrics.jsonl"
SMOKE_LABEL = "agl_smoke"


# -- the model --------------------------------------------------------------------------------------------------


def task_strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from task_strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from task_strings(item)


def tiny_model(plan: TrainPlan, out: TextIO) -> Path:
    """A ~1 M-parameter model with random weights and a tokenizer learned from the tasks' text: it shows the whole
    path works; it learns little. A real model (--model DIR) is what a user trains."""
    from services.engine.tiny_model import build_tiny_model

    path = plan.output / "base-model"
    positions = prompt_fit.tiny_positions(plan.max_prompt_length, plan.max_response_length)
    if (path / "config.json").is_file():
        prompt_fit.check_resumed_tiny_model(path, positions)
        return path
    long = f", {positions:,} positions" if positions > prompt_fit.POSITIONS else ""
    out.write(f"model: a tiny random model{long} (--model tiny; pass --model DIR to train a real one)\n")
    partial = path.with_name("base-model.partial")
    corpus = [text for task in plan.tasks for text in task_strings(task)]
    build_tiny_model(partial, corpus=corpus + list(sft.example_strings(plan.sft_examples)), positions=positions)
    partial.rename(path)
    return path


# -- the trainer --------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def trainer_process(argv: Sequence[str], env: Mapping[str, str], log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The trainer in its own process group (Ray's processes with it), stopped as a group on the way out. It runs in
    the checkout agl runs from, or, for an installed AGL, where agl runs."""
    with open(log_path, "ab") as log_file:
        proc = subprocess.Popen(
            list(argv), stdout=log_file, stderr=subprocess.STDOUT, env=dict(env), cwd=CHECKOUT, start_new_session=True
        )
    try:
        yield proc
    finally:
        # Stopped early (an interruption, an error here): killed at once. A SIGTERM first would buy nothing: Ray's
        # task runner outlives its driver's SIGTERM and goes on training (a step nobody sees, its rollouts created
        # and then cut off). A kill is safe for resuming: verl names a checkpoint the latest only once it is whole,
        # and agl marks the run in the ledger itself. Ray's helpers share the group: nothing stays behind.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def trainer_error(log_path: Path) -> str:
    """The line of the trainer's log that says why it stopped: its own one-line refusal, else the last error."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return "no trainer log"
    for line in reversed(lines):
        if line.startswith("agl-trainer: "):
            return line.removeprefix("agl-trainer: ")
    for line in reversed(lines):
        text = line.strip()
        if text and (text.split(":", 1)[0].endswith(("Error", "Exception")) or text.startswith("ray.exceptions")):
            return text[:400]
    return (lines[-1] if lines else "the trainer wrote nothing")[:400]


def follow(
    proc: subprocess.Popen[bytes],
    trainer_metrics: Path,
    out: TextIO,
    records: list[dict[str, Any]],
    *,
    total: int,
    history: Path | None = None,
    multi_turn: bool = False,
    val_label: str = "held-out reward",
    check: Callable[[], None] | None = None,
    warnings: report.TrainerWarnings | None = None,
) -> list[dict[str, Any]]:
    """Prints each step the trainer logs until it exits, and appends it to the run's history (verl's file logger
    starts its file anew at every launch, so a resumed run would lose the steps before). Records go into `records`
    as they come (an interruption still knows the last step). `check` raises when what the trainer needs stopped
    (check_services). warnings: the trainer's log, whose health warnings the step lines name."""
    started = time.monotonic()
    offset = 0
    while True:
        done = proc.poll() is not None
        fresh, offset = report.read_metrics(trainer_metrics, offset)
        if fresh and not records and history is not None:
            report.forget_redone_steps(history, fresh[0])
        if fresh and history is not None:
            with history.open("a") as sink:
                sink.writelines(json.dumps(record) + "\n" for record in fresh)
        for record in fresh:
            if not records:
                started = time.monotonic()  # the pace counts from the first record, after the start-up
            records.append(record)
            step = int(record["step"])
            done_here = step - int(records[0]["step"])
            # The pace of this launch (a resumed run does not count the steps it inherited), as progress_bar wants it.
            elapsed = (time.monotonic() - started) / done_here * step if done_here > 0 else None
            named = warnings.read().get(step, []) if warnings is not None else []
            line = report.step_line(
                record, total, multi_turn=multi_turn, val_label=val_label, elapsed_s=elapsed, warnings=named
            )
            out.write(line + "\n")
            out.flush()
        if done:
            return records
        if check is not None:
            check()
        time.sleep(0.25)


# -- the run ------------------------------------------------------------------------------------------------------


async def mark_run(stack: Stack, run_id: str, message: str) -> bool:
    """Marks the run failed with message unless it already ended; whether it was marked."""
    async with stack.client() as client:
        try:
            run = await client.get_run(run_id)
        except Exception:  # no run yet (the trainer never got to create it): nothing to mark
            return False
        if run.state != run_pb2.RUN_STATE_RUNNING:
            return False
        await client.update_run_state(run_id, run_pb2.RUN_STATE_FAILED, message)
        return True


def agent_log(stack: Stack, rollout_id: str) -> Path:
    from services.controller.local.local_runner import file_stem

    return stack.agent_logs / f"{file_stem(rollout_id)}.log"


async def clear_stale_pause(stack: Stack) -> str:
    """A trainer stopped during a weight update leaves the proxies paused in the ledger (the pause is durable, so
    that every replica honours it): no trainer runs yet, so nothing should be paused. The reason, when cleared."""
    async with stack.client() as client:
        control = await client.get_proxy_control()
        if not control.paused:
            return ""
        await client.set_proxy_pause(False)
        return control.reason or "no reason recorded"


async def smoke_rollout(plan: TrainPlan, stack: Stack) -> dict[str, Any]:
    """One rollout of the first task through the whole stack (greedy, as validation runs), before training."""
    rollout_id = f"{plan.run_id}-smoke-{int(time.time())}"
    labels = {SMOKE_LABEL: plan.run_id}
    spec = collect.agent_spec(plan, rollout_id, plan.tasks[0], labels, is_train=False)
    async with stack.client() as client:
        rollouts = collect.run_rollouts(client, [spec], labels, deadline_s=plan.rollout_timeout + 120)
        [record] = await while_services_run(stack, rollouts)
        await client.delete_rollouts([rollout_id])
    return record


def run_interruptible(command: str, body: Callable[[], int], out: TextIO) -> int:
    """body's exit code; Ctrl-C and SIGTERM stop every service it started (its context managers unwind) and end
    it with one line and 128 + the signal (agl eval, agl try)."""
    received: list[int] = []
    previous = raise_on_signals(received)
    try:
        try:
            code = body()
        except BaseException as error:
            stop = interrupted_by(received, error)
            if stop is None:
                raise
        else:
            stop = interrupted_by(received, None)
            if stop is None:
                return code
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)  # the services' stop is bounded: not cut short by a second signal
        out.write(f"\nagl {command}: interrupted by {stop}; everything it started has been stopped\n")
        return 128 + stop.signum
    finally:
        restore_handlers(previous)


def train(plan: TrainPlan, out: TextIO = sys.stdout, *, base_model: Path | None = None) -> int:
    """Runs the plan; the exit code. base_model: a model the caller prepared (else --model, or the tiny one)."""
    plan.output.mkdir(parents=True, exist_ok=True)
    prepared: list[Path] = []

    def prepare_model() -> int:
        # Interruptible like the rest: a supervised start takes minutes, and a shell's background job starts with
        # SIGINT ignored until handlers are installed (Ctrl-C went unheard until the services started).
        path = base_model or (tiny_model(plan, out) if plan.model == options.TINY_MODEL else Path(plan.model))
        if plan.supervised is not None:
            path = sft.supervised_start(path, plan.sft_examples, plan.supervised, plan.output / "supervised-model", out)
        prepared.append(path)
        return 0

    stopped = run_interruptible("train", prepare_model, out)
    if stopped or not prepared:
        return stopped
    model_path = prepared[0]
    if not plan.resume:
        for stale in (METRICS_FILE, TRAJECTORIES_FILE, "reward_curve.png"):
            (plan.output / stale).unlink(missing_ok=True)
    write_run_file(plan, model_path, "running")
    previous = raise_on_signals()
    records: list[dict[str, Any]] = []
    try:
        # A resumed run's engine starts from the base model too: the trainer pushes the checkpoint's weights first.
        engine_model = model_path if plan.placement == "cpu" else None
        with running_stack(
            plan.output,
            model_dir=engine_model,
            max_model_len=checks.engine_context(model_path, plan.max_prompt_length + plan.max_response_length),
            concurrency=max(8, plan.tasks_per_step * plan.group_size),
            agent_path=checks.agent_import_path(),
            out=out,
            tool_call_parser=plan.tool_call_parser,
            lora=(plan.lora_rank, plan.lora_alpha),
        ) as stack:
            try:
                code, figures = _train_in(stack, plan, model_path, out, records)
            except Interrupted as stop:
                # Marked while the ledger still runs; a second signal meanwhile is ignored (the stop is bounded).
                for sig in previous:
                    signal.signal(sig, signal.SIG_IGN)
                step = max((int(r["step"]) for r in records), default=0)
                with contextlib.suppress(Exception):
                    run_async(mark_run(stack, plan.run_id, f"interrupted by {stop} after step {step}"))
                raise
    except Interrupted as stop:
        step = max((int(r["step"]) for r in records), default=0)
        write_run_file(plan, model_path, "interrupted", step=step)
        out.write(
            f"\nagl train: interrupted by {stop} after step {step}; everything it started has been stopped. "
            f"Continue with: agl train --run-id {plan.run_id} --resume (and the same options)\n"
        )
        return 128 + stop.signum
    finally:
        restore_handlers(previous)
    if code != 0:
        return code
    # --export-weights, by default the best validation's when the run kept them (trainer/best.py), else the last.
    choice = export.choose_weights(plan.output, plan.export_weights)
    out.write(f"weights: {choice.describe()}\n")
    if plan.lora_rank:
        best_adapter = plan.output / export.BEST_DIR / ADAPTER if choice.which == "best" else None
        adapter = lora.export_adapter(plan.output, model_path, plan.output / "adapter", source=best_adapter)
        merged = {}
        if plan.merge_adapter:
            merged_dir = lora.merge_adapter(
                model_path, adapter, plan.output / "model", plan.export_dtype, export.MODEL_FILES
            )
            merged = {"model": str(merged_dir)}
        write_run_file(
            plan, model_path, "succeeded", adapter=str(adapter), exported_weights=choice.which, **merged, **figures
        )
        out.write(
            f"adapter: {adapter} (PEFT: PeftModel.from_pretrained(base, '{adapter}'); serve it: vLLM --enable-lora "
            f"--lora-modules NAME={adapter} over the base model {model_path})\n"
        )
        if merged:
            out.write(f"model: {merged['model']} (the base model with the adapter merged in)\n")
    else:
        model_dir = export.export_model(plan.output, plan.output / "model", dtype=plan.export_dtype, which=choice.which)
        write_run_file(plan, model_path, "succeeded", model=str(model_dir), exported_weights=choice.which, **figures)
        out.write(
            f"model: {model_dir} (transformers: AutoModelForCausalLM.from_pretrained('{model_dir}'); "
            f"serve it: agl-engine --model-dir {model_dir}; score it: agl eval --model {model_dir} ...)\n"
        )
    if figures["trained_steps"] == 0:
        what = "no step had a learning signal (every group's rewards were equal), the model did not change"
        if plan.allow_no_learning:
            out.write(f"note: {what}\n")
            return 0
        out.write(f"agl train: {what}; check the rewards in the trajectories (--allow-no-learning exits 0 anyway)\n")
        return FAILURE
    return 0


async def preflight_rollouts(plan: TrainPlan, stack: Stack, first: int, count: int) -> list[dict[str, Any]]:
    """A group of the run's size on each of `count` tasks from task `first`, sampled as training samples."""
    stamp = int(time.time())
    labels = {SMOKE_LABEL: plan.run_id}
    specs = [
        collect.agent_spec(
            plan, f"{plan.run_id}-preflight-{stamp}-{task}-{sample}", plan.tasks[task], {**labels, "group": f"g{task}"},
            is_train=True,
        )
        for task in range(first, first + count)
        for sample in range(plan.group_size)
    ]  # fmt: skip
    async with stack.client() as client:
        rollouts = collect.run_rollouts(client, specs, labels, deadline_s=plan.rollout_timeout + 120)
        records = await while_services_run(stack, rollouts)
        await client.delete_rollouts([spec.rollout_id for spec in specs])
    return records


def _preflight(stack: Stack, plan: TrainPlan, model_path: Path, out: TextIO) -> int | None:
    """The pre-flight's line; an exit code when the run stops here (a rollout failed, or GRPO cannot learn)."""
    limit = min(preflight.MAX_TASKS, len(plan.tasks))
    records: list[dict[str, Any]] = []
    while True:
        sampled = len(records) // plan.group_size
        count = min(max(preflight.FIRST_ROUND_TASKS, sampled), limit - sampled)  # 4, 4, 8, 16: doubling
        out.write(f"pre-flight: {count}{' more' if records else ''} tasks x {plan.group_size} samples...\n")
        out.flush()
        records += run_async(preflight_rollouts(plan, stack, sampled, count))
        for record in records:
            problem = collect.rollout_problem(record, agent_log(stack, record["rollout_id"]))
            if problem:
                write_run_file(plan, model_path, "failed", error=problem)
                out.write(f"agl train: a pre-flight rollout failed, nothing was trained: {problem}\n")
                return USAGE
        found = preflight.judge(records, plan.group_size)
        if found.mixed_groups or found.groups >= limit:
            break
    out.write(f"pre-flight: {found.line()}\n")
    refusal = found.refusal()
    if refusal is None:
        return None
    if plan.allow_no_learning:
        out.write(f"note: {refusal}\n")
        return None
    write_run_file(plan, model_path, "failed", error=refusal)
    out.write(f"agl train: {refusal}\n")
    return FAILURE


def _train_in(
    stack: Stack, plan: TrainPlan, model_path: Path, out: TextIO, records: list[dict[str, Any]]
) -> tuple[int, dict[str, Any]]:
    """The smoke rollout, then the trainer followed to its end: (exit code, the summary's figures)."""
    out.write(f"console: {stack.console_url} (sign in with the key in {stack.key_file})\n")
    stale = run_async(clear_stale_pause(stack))
    if stale:
        out.write(f"resumed the proxies, paused by the interrupted trainer ({stale})\n")
    if plan.placement == "cpu":
        out.write("smoke rollout: the agent on the first task through the stack...\n")
        out.flush()
        try:
            record = run_async(smoke_rollout(plan, stack))
        except CliError as err:  # a service stopped meanwhile
            write_run_file(plan, model_path, "failed", error=str(err))
            raise
        # A first prompt that does not fit is named first: the agent's own failure is often what the 400 made of it.
        measured = run_async(prompt_fit.measure_first_prompt(record, stack.engine_url))
        tiny, lengths = plan.model == options.TINY_MODEL, (plan.max_prompt_length, plan.max_response_length)
        problem = prompt_fit.problem(measured, prompt_fit.run_limits(tiny, model_path, *lengths)) if measured else None
        if problem:
            write_run_file(plan, model_path, "failed", error=problem)
            out.write(f"agl train: {problem}\n")
            return USAGE, {}
        # With a judge the agent need post no reward: the judge gives it during training.
        problem = collect.rollout_problem(record, agent_log(stack, record["rollout_id"]), plan.judge is None)
        if problem:
            write_run_file(plan, model_path, "failed", error=problem)
            out.write(f"agl train: the smoke rollout failed, nothing was trained: {problem}\n")
            return USAGE, {}
        first = f", first prompt {measured} of --max-prompt-length {plan.max_prompt_length}" if measured else ""
        reward = "none (the judge's, in training)" if record["reward"] is None else record["reward"]
        out.write(f"smoke rollout: ok ({len(record['calls'])} model call(s){first}, reward {reward})\n")
        if plan.judge is not None:  # the rewards the pre-flight would compare come from the judge, during training
            out.write("pre-flight: skipped, the judge scores the groups during training (agl/judge/* per step)\n")
        elif plan.preflight and not plan.resume:  # a resumed run learned from its start already
            refused = _preflight(stack, plan, model_path, out)
            if refused is not None:
                return refused, {}
    argv = [
        sys.executable,
        "-m",
        "services.trainer",
        *trainer_args.overrides(plan, stack.ledger, stack.model_name, model_path),
    ]
    log_path = stack.logs / "trainer.log"
    trainer_metrics = stack.logs / "trainer-metrics.jsonl"
    trainer_metrics.unlink(missing_ok=True)
    reporters = reporting.trainer_environment(plan.report_to, plan.output)
    env = child_environment({"VERL_FILE_LOGGER_PATH": str(trainer_metrics), "AGL_KEY": stack.key, **reporters})
    what = f"{plan.steps} steps of {plan.tasks_per_step} tasks x {plan.group_size} rollouts"
    verb = "resuming" if plan.resume else "training"
    out.write(f"run {plan.run_id}: {verb}, {what}, {plan.placement} (trainer log: {log_path})\n")
    out.flush()
    metrics_path = plan.output / METRICS_FILE
    warnings = report.TrainerWarnings(log_path)  # before the launch: what this launch logs
    try:
        with trainer_process(argv, env, log_path) as proc:
            follow(
                proc,
                trainer_metrics,
                out,
                records,
                total=plan.steps,
                history=metrics_path,
                multi_turn=plan.multi_turn,
                val_label=plan.val_label,
                check=lambda: check_services(stack),
                warnings=warnings,
            )
    except CliError as err:  # a service stopped under the trainer (the trainer is stopped with it)
        with contextlib.suppress(Exception):
            run_async(mark_run(stack, plan.run_id, str(err)))
        write_run_file(plan, model_path, "failed", error=str(err))
        raise
    if proc.returncode != 0:
        why = trainer_error(log_path)
        run_async(mark_run(stack, plan.run_id, f"the trainer exited with {proc.returncode}: {why}"))
        write_run_file(plan, model_path, "failed", error=why)
        out.write(f"agl train: the trainer stopped (exit {proc.returncode}): {why}\n  log: {log_path}\n")
        return FAILURE, {}
    everything = report.read_metrics(metrics_path, 0)[0]
    label = "held-out greedy " + plan.val_label.split()[-1]
    figures = report.summary(everything, plan.output, out, tools=plan.multi_turn, val_label=label)
    out.write("stopping the services\n")
    return 0, figures


def run_train_command(args: argparse.Namespace) -> int:
    plan = plan_from_args(args)
    multi = "s" if len(plan.tasks) != 1 else ""
    print(f"checks passed in {plan.checks_s:.1f}s: {len(plan.tasks)} task{multi}, output {plan.output}")
    if plan.judge is not None and plan.judge.url is None and plan.model == options.TINY_MODEL:
        print("note: --judge without --judge-url: the tiny random model judges, and its replies are not scores: "
              "the groups it cannot score are left out, and a step it scores none of stops the run (docs: "
              "training/judge)")  # fmt: skip
    if args.detach:  # the same command in a session of its own; the checks above are its first lines here
        return background.detach(sys.argv[1:], plan.run_id, plan.output, sys.stdout)
    if not plan.resume and not args.run_id:
        for run_id, step in unfinished_runs_like(plan, options.RUNS_DIR):
            print(f"note: run {run_id} of this agent and data was interrupted after step {step}; this is a new run "
                  f"(continue that one with --run-id {run_id} --resume)")  # fmt: skip
    return train(plan)
