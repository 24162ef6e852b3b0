"""Training through faults: a CPU run with random kill -9s against a clean run from the same seed (issue 29).

Both arms run the demo's stack as `agl train` starts it (ledger on SQLite, proxy, controller, the CPU vLLM engine,
as local processes), the unmodified math agent, the same warm start, tasks and seed, a checkpoint every step. The
faulted arm kills, at random moments of random steps (seeded): the trainer twice (then the same command again,
which resumes from its checkpoint), the engine twice, the ledger twice, the proxy and the controller (each
brought back as compose's `restart: unless-stopped` does: same port, same data). Reports, for each arm:

  accuracy      held-out greedy accuracy before and after (within noise of each other is the target)
  steps         steps on record: each once, none missing
  consumed      rollouts trained by two steps (target 0), from the trajectory log
  stranded      rollouts of the run still queuing or running in the ledger at the end (target 0)
  lost          succeeded rollouts consumed without the reward their agent posted (target 0)
  faults        per kill: what, at which step, the seconds until the service was healthy again (the engine
                and the trainer: until the next step was on record), and the run's extra wall time

    .venv/bin/python bench/training_faults_bench.py [--steps 40] [--kills 8] [--seed 0] [--skip-clean]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from services._gen.agl.v1 import rollout_pb2  # noqa: E402
from services.cli.train import checks, session  # noqa: E402
from services.cli.train.stack import Stack, child_environment, running_stack  # noqa: E402
from services.stack import local_stack  # noqa: E402
from tools import demo_train  # noqa: E402

# What is killed, in a random order: the trainer and the three services that restart in seconds, the engine
# (~40 s to start again) twice as the issue asks.
KILLS = ("trainer", "trainer", "engine", "engine", "ledger", "ledger", "proxy", "controller")
LIVE = (rollout_pb2.ROLLOUT_STATE_QUEUING, rollout_pb2.ROLLOUT_STATE_RUNNING)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    demo_train.add_arguments(parser)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--kills", type=int, default=len(KILLS), help=f"kills in the faulted arm (<= {len(KILLS)})")
    parser.add_argument("--seed", type=int, default=0, help="where and when the kills fall")
    parser.add_argument("--data-dir", type=Path, default=REPO / "data" / "bench")
    parser.add_argument("--output-dir", type=Path, default=REPO / "data" / "bench" / "faults")
    parser.add_argument("--skip-clean", action="store_true", help="the faulted arm only")
    parser.add_argument("--kinds", default=",".join(sorted(set(KILLS))),
                        help="what may be killed, comma-separated (default: all); the schedule draws from KILLS' "
                        "entries of these kinds")  # fmt: skip
    # An engine away longer than the agents' own retries (~130 s of 503s with the OpenAI SDK's) loses every rollout
    # of its step to the infrastructure: the trainer runs that step again (agl.infra_failures.step_redos).
    parser.add_argument("--engine-down-seconds", type=float, default=1.0,
                        help="seconds a killed engine stays down before it is started again")  # fmt: skip
    # The demo's agents time out after 60 s; the CPU engine takes 40-70 s to start again here, and a rollout in
    # flight when it dies waits for it (in the proxy, then in its SDK's retries). With 60 s every rollout of that
    # step timed out and the run stopped ("every rollout failed").
    parser.add_argument("--rollout-timeout", type=int, default=300, help="seconds a rollout may take (both arms)")
    parser.set_defaults(steps=40, val_every=20)
    args = parser.parse_args(argv)
    kinds = set(args.kinds.split(","))
    if not kinds <= set(KILLS):
        parser.error(f"--kinds: among {', '.join(sorted(set(KILLS)))}")
    args.kills_drawn_from = tuple(k for k in KILLS if k in kinds)
    if not 0 <= args.kills <= len(args.kills_drawn_from):
        parser.error(f"--kills: from 0 to {len(args.kills_drawn_from)} (KILLS' entries of --kinds)")
    if args.engine_down_seconds < 0:
        parser.error("--engine-down-seconds: 0 or more")
    if args.kills and args.steps < args.kills + 4:
        parser.error(f"--steps: at least {args.kills + 4} for {args.kills} kills (one a step, none in the last 3)")
    return args


def schedule(args: argparse.Namespace) -> list[tuple[int, str, float]]:
    """(step, what, delay): after step `step` is on record, wait `delay` s (into the next step), then kill."""
    rng = random.Random(args.seed)
    steps = sorted(rng.sample(range(1, args.steps - 2), args.kills))
    kinds = rng.sample(args.kills_drawn_from, len(args.kills_drawn_from))[: args.kills]
    return [(step, kind, round(rng.uniform(0.0, 2.0), 2)) for step, kind in zip(steps, kinds, strict=True)]


def steps_on_record(metrics: Path) -> list[int]:
    if not metrics.exists():
        return []
    lines = metrics.read_text().splitlines()
    return [json.loads(line)["step"] for line in lines if line.endswith("}") and '"step"' in line]


class TrainerCommand:
    """The trainer command of the arm, started again after a kill (it resumes from its checkpoint). verl's file
    logger starts its file afresh at each start: what a killed trainer wrote is kept in `history` first."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path, metrics: Path) -> None:
        self.argv, self.env, self.log, self.metrics = argv, env, log, metrics
        self.history = metrics.with_name("trainer-metrics-history.jsonl")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=REPO, start_new_session=True
            )

    def kill(self) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        if self.metrics.exists():
            with open(self.history, "a") as history:
                history.write(self.metrics.read_text())

    def records(self) -> list[dict[str, Any]]:
        """Every step record the trainer wrote, across its restarts, in order."""
        text = (self.history.read_text() if self.history.exists() else "") + self.metrics.read_text()
        return [json.loads(line) for line in text.splitlines() if line.endswith("}")]


def wait_for_step(metrics: Path, step: int, trainer: TrainerCommand, timeout_s: float = 1800) -> None:
    deadline = time.monotonic() + timeout_s
    while max(steps_on_record(metrics), default=0) < step:
        assert trainer.proc is not None
        if trainer.proc.poll() is not None:
            raise SystemExit(f"the trainer exited with {trainer.proc.returncode} before step {step}: {trainer.log}")
        if time.monotonic() > deadline:
            raise SystemExit(f"no step {step} within {timeout_s:.0f}s: {trainer.log}")
        time.sleep(0.1)


def inject(kind: str, stack: Stack, trainer: TrainerCommand, metrics: Path, step: int, engine_down_s: float) -> float:
    """One kill and the restart; the seconds the fault cost until the killed part served (or trained) again."""
    killed = time.monotonic()
    if kind == "trainer":
        trainer.kill()
        trainer.start()
        wait_for_step(metrics, step + 1, trainer)
        return time.monotonic() - killed
    health = 300.0 if kind == "engine" else 60.0
    down = engine_down_s if kind == "engine" else 1.0
    away = local_stack.kill_and_restart(stack.services, kind, down_s=down, health_timeout_s=health)
    if kind == "engine":  # back, then given the current weights by the trainer: the next step on record
        wait_for_step(metrics, step + 1, trainer)
        return time.monotonic() - killed
    return away


async def ledger_state(stack: Stack, run_id: str) -> tuple[int, int]:
    async with stack.client() as client:
        rollouts = await client.list_rollouts(labels={"agl_run": run_id})
    return len(rollouts), sum(r.status.state in LIVE for r in rollouts)


def arm(args: argparse.Namespace, name: str, faults: list[tuple[int, str, float]]) -> dict[str, Any]:
    out_dir = (args.output_dir / name).resolve()
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    agent = demo_train.resolve_agent_defaults(args)
    data_dir = args.data_dir.resolve()
    train_file, val_file, train = demo_train.prepare_tasks(data_dir, args, agent)
    with open(out_dir / "bench.log", "w") as log:
        held_out = demo_train.start_held_out(args, agent)
        model = demo_train.prepare_model(
            data_dir / "models", train, args.warm_start_steps, log, agent, held_out=held_out
        )
        plan = demo_train.demo_plan(args, agent, model, train_file, val_file, train)
        run_id, timeout = f"faults-{name}-{args.seed}", float(args.rollout_timeout)
        plan = dataclasses.replace(plan, run_id=run_id, save_every=1, output=out_dir, rollout_timeout=timeout)
        context = checks.engine_context(model, plan.max_prompt_length + plan.max_response_length)
        started = time.monotonic()
        with running_stack(
            out_dir, model_dir=model, max_model_len=context, concurrency=max(8, plan.tasks_per_step * plan.group_size),
            agent_path=[str(REPO)], out=log, tool_call_parser=plan.tool_call_parser, console=False,
        ) as stack:  # fmt: skip
            metrics = stack.logs / "trainer-metrics.jsonl"
            argv = [sys.executable, "-m", "services.trainer", *session.trainer_overrides(plan, stack, model)]
            env = child_environment({"VERL_FILE_LOGGER_PATH": str(metrics), "AGL_KEY": stack.key})
            trainer = TrainerCommand(argv, env, stack.logs / "trainer.log", metrics)
            trainer.start()
            costs = []
            for step, kind, delay in faults:
                wait_for_step(metrics, step, trainer)
                time.sleep(delay)
                cost = inject(kind, stack, trainer, metrics, step, args.engine_down_seconds)
                costs.append({"after_step": step, "killed": kind, "seconds": round(cost, 1)})
                print(f"{name}: kill -9 of the {kind} after step {step} (+{delay}s): {cost:.1f}s", flush=True)
            assert trainer.proc is not None
            code = trainer.proc.wait(timeout=3600)
            wall = time.monotonic() - started
            total, live = asyncio.run(ledger_state(stack, plan.run_id))
    if code != 0:
        raise SystemExit(f"{name}: the trainer exited with {code}; see {trainer.log}")
    return figures(out_dir, trainer.records(), plan.steps) | {
        "wall_s": round(wall, 1),
        "faults": costs,
        "stranded": live,
        "rollouts_in_ledger": total,
    }


def figures(out_dir: Path, records: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    # A resumed trainer writes a redone step again: the last record of each step is the one that counts.
    by_step = {r["step"]: r["data"] for r in records}
    accuracy = [
        (s, round(d["val/agl/reward_mean"], 4)) for s, d in sorted(by_step.items()) if "val/agl/reward_mean" in d
    ]
    trained = [json.loads(line) for line in (out_dir / session.TRAJECTORIES_FILE).read_text().splitlines()]
    trained = [r for r in trained if r.get("kind", "train") == "train"]
    per_rollout = collections.Counter(r["rollout_id"] for r in trained)
    return {
        "accuracy_by_step": accuracy,
        "accuracy_before": accuracy[0][1] if accuracy else None,
        "accuracy_after": accuracy[-1][1] if accuracy else None,
        "steps_on_record": sorted(s for s in by_step if s > 0) == list(range(1, steps + 1)),
        "rollouts_trained": len(per_rollout),
        "consumed_twice": sum(n > 1 for n in per_rollout.values()),
        "lost_rewards": sum(1 for r in trained if r["succeeded"] and r["reward_missing"]),
        "reward_mean_last_10": round(
            sum(by_step[s].get("agl/reward/mean", 0.0) for s in range(max(1, steps - 9), steps + 1)) / min(10, steps),
            4,
        ),
        # Steps whose rollouts were all lost to the infrastructure and run again, and how many rollouts they lost.
        "redone_steps": {s: int(d["agl/step/redone"]) for s, d in sorted(by_step.items()) if d.get("agl/step/redone")},
        "lost_rollouts": int(sum(d.get("agl/step/lost_rollouts", 0) for d in by_step.values())),
    }


def main() -> int:
    args = parse()
    args.output_dir.mkdir(parents=True, exist_ok=True)
    faults = schedule(args)
    results: dict[str, Any] = {"schedule": faults}
    if not args.skip_clean:
        results["clean"] = arm(args, "clean", [])
    results["faulted"] = arm(args, "faulted", faults)
    print(json.dumps(results, indent=2))
    clean, faulted = results.get("clean"), results["faulted"]
    line = f"faulted: held-out accuracy {faulted['accuracy_before']} -> {faulted['accuracy_after']}"
    if clean:
        line += f"; clean: {clean['accuracy_before']} -> {clean['accuracy_after']}"
        line += f"; the faults cost {faulted['wall_s'] - clean['wall_s']:.0f}s of wall time"
    line += (
        f"; consumed twice {faulted['consumed_twice']}, stranded {faulted['stranded']}, "
        f"rewards lost {faulted['lost_rewards']}"
    )
    print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
