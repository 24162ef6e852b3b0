"""GPU smoke run: two steps of the real `AglPPOTrainer.fit` on one GPU, colocated (verl's own vLLM replica
beside the actor, weights through verl's checkpoint engine), the unmodified math agent as processes through
the ledger, proxy and controller. Prepared to run as is on a machine with one NVIDIA GPU and the trainer
image's packages (verl 0.9.1, vLLM for CUDA, Ray); it needs no network: the tiny model is made here.

    python tools/gpu_smoke.py [--steps 2] [--model /path/to/hf-model] [--data-dir data/gpu-smoke]

Checks, each printed as PASS or FAIL: the trainer exits 0; every step updated or was skipped for no signal;
the engine/trainer log-prob gap is printed; the replicas are registered at the last step's version; only the
retained steps' rollouts are left in the ledger. Exit code 0 only when every check passes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from deploy import local_stack  # noqa: E402
from services.cli.train import session  # noqa: E402
from services.client import LedgerClient  # noqa: E402
from tools import demo_train  # noqa: E402

# agl.retention.keep_steps of agl_trainer.yaml (not overridden here).
KEEP_STEPS = 2


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--model", type=Path, default=None, help="a Hugging Face model dir (default: made here)")
    parser.add_argument("--data-dir", type=Path, default=REPO_ROOT / "data" / "gpu-smoke")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    return parser.parse_args(argv)


def overrides(args: argparse.Namespace, run_id: str, ledger: str, key: str, model: Path, tasks: Path) -> list[str]:
    state = args.data_dir.resolve() / "runs" / run_id
    items = [
        f"agl.run_id={run_id}",
        f"agl.ledger_address={ledger}",
        f"agl.launch.agent_class={demo_train.MATH_AGENT}",
        *(f"+agl.launch.env_map.{name}={path}" for name, path in demo_train.TASK_ENV.items()),
        "agl.launch.timeout_seconds=120",
        f"agl.state_dir={state / 'manager'}",
        f"agl.trajectory_log={state / 'trajectories.jsonl'}",
        "agl.progress=false",
        f"data.train_files={tasks}",
        "data.train_batch_size=4",
        "data.max_prompt_length=128",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.rollout.response_length=32",
        f"actor_rollout_ref.rollout.gpu_memory_utilization={args.gpu_memory_utilization}",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.actor.optim.lr=1e-4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        # A short run: no CUDA graph capture in vLLM and no torch.compile of the actor (minutes of compiling).
        "actor_rollout_ref.rollout.enforce_eager=true",
        "actor_rollout_ref.actor.use_torch_compile=false",
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile=false",
        "actor_rollout_ref.ref.fsdp_config.use_torch_compile=false",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        f"trainer.total_training_steps={args.steps}",
        "trainer.save_freq=-1",
        "trainer.test_freq=-1",
        "trainer.logger=[console,file]",
        f"trainer.default_local_dir={state / 'checkpoints'}",
    ]
    if key:
        items.append(f"agl.key={key}")
    return items


def steps_trained_or_skipped(steps: dict[int, dict[str, Any]], total: int) -> tuple[bool, str]:
    """Every step has actor metrics, or was skipped for no learning signal (by design); at least one updated."""
    updated = [n for n in range(1, total + 1) if "actor/pg_loss" in steps.get(n, {})]
    skipped = [n for n in range(1, total + 1) if steps.get(n, {}).get("agl/update/skipped_no_signal") == 1.0]
    missing = [n for n in range(1, total + 1) if n not in updated and n not in skipped]
    return bool(updated) and not missing, f"updated {updated}, skipped (no signal) {skipped}, neither {missing}"


def retention_kept(step_labels: list[int | None], last_step: int, keep_steps: int) -> tuple[bool, str]:
    """What the ledger holds of the run after its last step: only the last keep_steps steps' rollouts
    (agl.retention.keep_steps; 0: none, -1: all)."""
    if keep_steps < 0:
        return True, f"{len(step_labels)} kept (keep_steps -1)"
    oldest = last_step - keep_steps + 1
    stale = [s for s in step_labels if s is None or s < oldest]
    return not stale, f"{len(step_labels)} left, {len(stale)} from steps before {oldest}"


def check(name: str, ok: bool, detail: str = "") -> bool:
    print(f"{'PASS' if ok else 'FAIL'}  {name}{': ' + detail if detail else ''}", flush=True)
    return ok


async def ledger_state(ledger: str, key: str, run_id: str, model_name: str) -> tuple[list[int | None], list[Any]]:
    async with LedgerClient(ledger, key=key or None) as client:
        left = await client.list_rollouts(labels={"agl_run": run_id})
        labels = [r.metadata.labels.get("agl_step", "") for r in left]
        steps = [int(v) if v.isdigit() else None for v in labels]
        return steps, list(await client.list_models(model_name))


def main() -> int:
    args = parse()
    data_dir = args.data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    task_args = argparse.Namespace(train_tasks=64, val_tasks=8, max_operand=19)
    train_file, _, train = demo_train.prepare_tasks(data_dir, task_args)
    model = args.model or demo_train.prepare_model(data_dir / "models", train, 100, sys.stdout)
    run_id = f"gpu-smoke-{uuid.uuid4().hex[:6]}"
    specs = local_stack.load_compose({}, [])
    specs = {name: specs[name] for name in ("ledger", "proxy", "controller")}
    plans = local_stack.localize(specs, data_dir, {"controller": {"AGL_CONTROLLER_LOG_DIR": str(data_dir / "agents")}})
    logs = data_dir / "logs"
    with local_stack.run_stack(plans, local_stack.start_order(specs), logs) as running:
        ledger = running["ledger"].address(int(specs["ledger"].env["AGL_LEDGER_PORT"]))
        key = specs["ledger"].env.get("AGL_KEY", "")
        model_name = specs["proxy"].env["AGL_MODEL_NAME"]
        metrics_path = data_dir / "runs" / run_id / "metrics.jsonl"
        metrics_path.parent.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "services.trainer", *overrides(args, run_id, ledger, key, model, train_file)]
        env = local_stack.child_environment({"VERL_FILE_LOGGER_PATH": str(metrics_path)})
        print(f"run {run_id}: trainer log {logs / 'trainer.log'}", flush=True)
        records: list[dict[str, Any]] = []
        with session.trainer_process(argv, env, logs / "trainer.log") as proc:
            session.follow(proc, metrics_path, sys.stdout, records, total=args.steps)
            code = proc.returncode
        left, endpoints = asyncio.run(ledger_state(ledger, key, run_id, model_name))
    steps = {r["step"]: r["data"] for r in records if r["step"] > 0}
    trained, trained_detail = steps_trained_or_skipped(steps, args.steps)
    kept, kept_detail = retention_kept(left, args.steps, KEEP_STEPS)
    results = [
        check("trainer exit code", code == 0, str(code)),
        check("every step updated or skipped for no signal, one updated", trained, trained_detail),
        # The replicas serve the last step's update (model_version = the step whose update they loaded).
        check(
            "endpoints registered at the last step", bool(endpoints) and max(e.version for e in endpoints) == args.steps
        ),
        check("consumed rollouts beyond the retention deleted", kept, kept_detail),
    ]
    for n, data in sorted(steps.items()):
        gap = {k: data[k] for k in data if "probs_diff" in k or "logprob_diff" in k}
        print(f"step {n}: reward {data.get('agl/reward/mean')}  log-prob gaps {json.dumps(gap)}")
    if code != 0:
        print((logs / "trainer.log").read_text(errors="replace")[-4000:])
    return 0 if all(results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
