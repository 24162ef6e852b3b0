"""Two LoRA runs at once on one engine, one proxy and one ledger (issue 32's second target).

The demo's task (the math agent on additions, its warm-started tiny model, its held-out set) trained twice at the
same time: two `agl-trainer` runs with the demo's own settings (tools/demo_train.py demo_plan, `--lora R`), each with
its own model name (`agl-policy-a`, `agl-policy-b`: its adapter's name on the engine) and its pause scoped to its own
model (agl.async_training.pause_scope=model). One CPU vLLM engine serves the base model as `agl-base` and both
adapters (`--lora-rank R --max-loras 2`); the ledger, proxy and controller run as compose runs them. Each rollout is
labelled with its run's model and the proxy routes it there.

Per run, from its own step metrics: held-out greedy accuracy before and after (val/agl/reward_mean), the largest
engine/trainer log-prob gap over its steps (agl/push/logprob_diff_max; the target: below 1e-4 for both), the median
step time; and from the ledger, the models and versions that answered the calls of the run's last step (its
training rollouts, served by the previous version, and its held-out ones, by the last): its own model only.

    .venv/bin/python bench/lora_two_runs_bench.py [the demo's options: --steps 60 --lora 8 --tasks-per-step 16 ...]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import io
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from services._gen.agl.v1 import model_pb2  # noqa: E402
from services.cli.train import session  # noqa: E402
from services.stack import local_stack  # noqa: E402
from tests.support.engine import chat, run_engine  # noqa: E402
from tests.trainer import cpu_stack  # noqa: E402
from tools import demo_train  # noqa: E402
from tools.demo_agents import AGENTS  # noqa: E402

BASE = "agl-base"
RUNS = {"two-runs-a": "agl-policy-a", "two-runs-b": "agl-policy-b"}
VAL = "val/agl/reward_mean"
GAP = "agl/push/logprob_diff_max"


def demo_args(argv: list[str]) -> argparse.Namespace:
    """The demo's options: its defaults, then a rank-8 adapter and held-out accuracy before and after only, then
    the caller's (`--steps 30`, `--lora 16`, `--tasks-per-step 8`, `--data-dir DIR`, ...)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    demo_train.add_arguments(parser)
    parser.add_argument("--data-dir", type=Path, default=REPO / "data", help="tasks and the warm-started model")
    parser.set_defaults(lora=8, val_every=0, group_size=4, output_dir=None)
    args = parser.parse_args(argv)
    if not args.lora:
        parser.error("--lora 0 trains every weight; two runs on one engine share it through adapters")
    return args


def trainer_argv(args: argparse.Namespace, run_id: str, model: str, out: Path, stack: cpu_stack.Stack) -> list[str]:
    agent = AGENTS[args.agent]
    args.output_dir = out
    plan = demo_train.demo_plan(args, agent, args.model_path, args.train_file, args.val_file, args.train)
    plan = dataclasses.replace(plan, run_id=run_id)
    overrides = session.trainer_overrides(plan, SimpleNamespace(ledger=stack.ledger, model_name=model), args.model_path)
    extra = [f"agl.key={cpu_stack.KEY}", "agl.async_training.pause_scope=model", "trainer.save_freq=-1"]
    return [str(cpu_stack.TRAINER), *overrides, *extra]


async def answered(stack: cpu_stack.Stack, run_id: str, step: int) -> list[tuple[str, int]]:
    """(model, version) of every recorded call of the run's rollouts labelled with `step` (training and held-out)."""
    async with stack.client() as client:
        rollouts = await client.list_rollouts(labels={"agl_run": run_id, "agl_step": str(step)})
        pairs = set()
        for rollout in rollouts:
            for event in await client.list_events(rollout.rollout_id, event_type="model_request"):
                pairs.add((event.model_request.model, event.model_request.model_version))
    return sorted(pairs)


def summary(run_id: str, model: str, out: Path, seconds: float, stack: cpu_stack.Stack) -> dict[str, Any]:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    vals = [(r["step"], r["data"][VAL]) for r in records if VAL in r["data"]]
    steps = [r["data"] for r in records if r["step"] >= 1 and "timing_s/step" in r["data"]]
    gaps = [float(d[GAP]) for d in steps if GAP in d]
    last = max((r["step"] for r in records), default=0)
    return {
        "run": run_id,
        "model": model,
        "held_out_before": vals[0][1] if vals else None,
        "held_out_after": vals[-1][1] if len(vals) > 1 else None,
        "held_out": vals,
        "logprob_gap_max": max(gaps) if gaps else None,
        "step_s_median": statistics.median(float(d["timing_s/step"]) for d in steps) if steps else None,
        "steps": len(steps),
        "wall_s": round(seconds, 1),
        "last_step_calls_answered_by": asyncio.run(answered(stack, run_id, last)),
    }


def main() -> None:
    args = demo_args(sys.argv[1:])
    agent = demo_train.resolve_agent_defaults(args)
    args.train_file, args.val_file, args.train = demo_train.prepare_tasks(args.data_dir.resolve(), args, agent)
    args.model_path = demo_train.prepare_model(
        args.data_dir.resolve() / "models",
        args.train,
        args.warm_start_steps,
        sys.stdout,
        agent,
        held_out=demo_train.start_held_out(args, agent),
    )
    with tempfile.TemporaryDirectory(prefix="agl-two-runs-bench-") as tmp, contextlib.ExitStack() as started:
        root = Path(tmp)
        engine = started.enter_context(
            run_engine(
                args.model_path,
                model_name=BASE,
                args=["--lora-rank", str(args.lora), "--max-loras", "2", "--max-model-len", "512"],
                log_dir=root / "engine",
                start_timeout_s=600,
            )
        )
        chat(engine, "warm up")
        stack = started.enter_context(cpu_stack.start(root / "stack", engine))

        async def register() -> None:
            async with stack.client() as client:
                await client.register_models(
                    [model_pb2.ModelEndpoint(model_name=m, endpoint=engine.openai_url) for m in RUNS.values()]
                )

        asyncio.run(register())
        processes = {}
        for run_id, model in RUNS.items():
            out = root / run_id
            out.mkdir()
            env = local_stack.child_environment({"VERL_FILE_LOGGER_PATH": str(out / "metrics.jsonl")})
            log = (out / "trainer.log").open("w")
            argv = trainer_argv(args, run_id, model, out, stack)
            processes[run_id] = (subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT), out, model)
            what = f"{args.steps} steps of {args.tasks_per_step} tasks x {args.group_size}"
            print(f"{run_id}: {model}, {what} (log {out / 'trainer.log'})")
        started_at = time.monotonic()
        results = []
        for run_id, (process, out, model) in processes.items():
            code = process.wait()
            seconds = time.monotonic() - started_at
            if code != 0:
                sys.exit(f"{run_id}: agl-trainer exited {code}\n{(out / 'trainer.log').read_text()[-4000:]}")
            results.append(summary(run_id, model, out, seconds, stack))
    for result in results:
        print(json.dumps(result))
    buffer = io.StringIO()
    for r in results:
        buffer.write(
            f"{r['run']} ({r['model']}): held-out {r['held_out_before']} -> {r['held_out_after']}, "
            f"log-prob gap max {r['logprob_gap_max']:.2g}, step {r['step_s_median']:.2f} s, "
            f"last step's calls answered by {r['last_step_calls_answered_by']}\n"
        )
    print(buffer.getvalue(), end="")
    gaps_ok = all(r["logprob_gap_max"] is not None and r["logprob_gap_max"] < 1e-4 for r in results)
    print(f"target: both gaps below 1e-4: {'met' if gaps_ok else 'NOT met'}")


if __name__ == "__main__":
    main()
