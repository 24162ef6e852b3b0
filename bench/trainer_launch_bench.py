"""Trainer launch benchmark: how long `agl-trainer placement=cpu` takes to reach its first step, phase by phase.

Starts the real stack once (ledger, proxy and controller as compose runs them, the CPU vLLM engine serving the
tiny model), then launches a one-step training run `--runs` times and timestamps, on its output as it arrives,
when each phase was first seen:

  ray_up      "Started a local Ray instance" (the driver composed its config, checked the ledger, ran ray.init)
  runner_up   the task runner actor's first line (its process started and imported verl)
  workers_up  the actor worker's first line
  first_step  verl's `step:0` line (the weight sync before the first update)
  exit        the process ended (the step, its checkpoint, Ray's shutdown)

`--baseline CHECKOUT` launches that checkout's agl-trainer as well, alternating with this one's, so that both
are measured in the same run on the same machine (e.g. a worktree of an earlier commit with its own .venv).

    .venv/bin/python bench/trainer_launch_bench.py [--runs 3] [--baseline ../agl-before]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from services.stack import local_stack  # noqa: E402
from tests.support.engine import build_model, chat, run_engine  # noqa: E402
from tests.trainer import cpu_stack  # noqa: E402

PHASES = ("ray_up", "runner_up", "workers_up", "first_step", "exit")
MARKERS = {
    "ray_up": "Started a local Ray instance",
    "runner_up": "(AglTaskRunner pid=",
    "workers_up": "(WorkerDict pid=",
    "first_step": "step:0 ",
}


def launch(trainer: Path, stack: cpu_stack.Stack, engine: object, run_id: str, tasks: Path) -> dict[str, float]:
    out = stack.root / run_id
    out.mkdir()
    argv = [str(trainer), f"agl.ledger_address={stack.ledger}", f"agl.key={cpu_stack.KEY}"]
    argv += cpu_stack.trainer_overrides(engine, run_id, tasks, out, steps=1, lr=1e-3)  # type: ignore[arg-type]
    # The checkout's own code, in the driver and in its Ray workers (which put the working directory on their
    # path): child_environment alone would give both checkouts this one's.
    checkout = trainer.parents[2]
    env = local_stack.child_environment({"VERL_FILE_LOGGER_PATH": str(out / "metrics.jsonl")})
    env["PYTHONPATH"] = str(checkout)
    seen: dict[str, float] = {}
    lines: list[str] = []
    started = time.monotonic()
    proc = subprocess.Popen(
        argv, env=env, cwd=checkout, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    )

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            for phase, marker in MARKERS.items():
                if phase not in seen and marker in line:
                    seen[phase] = time.monotonic() - started

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    code = proc.wait(timeout=900)
    seen["exit"] = time.monotonic() - started
    reader.join(timeout=10)
    missing = [p for p in PHASES if p not in seen]
    if code != 0 or missing:
        sys.exit(f"{trainer}: exit {code}, phases not seen {missing}\n" + "".join(lines[-40:]))
    return seen


def report(name: str, runs: list[dict[str, float]]) -> dict[str, float]:
    medians = {phase: statistics.median(r[phase] for r in runs) for phase in PHASES}
    cells = "  ".join(f"{phase} {medians[phase]:6.1f}s" for phase in PHASES)
    print(f"{name:>9}: {cells}   (median of {len(runs)})")
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="launches per checkout")
    parser.add_argument("--baseline", type=Path, help="another checkout (with its .venv) to launch alternately")
    args = parser.parse_args()
    trainers = {"this": REPO / ".venv" / "bin" / "agl-trainer"}
    if args.baseline:
        trainers["baseline"] = args.baseline.resolve() / ".venv" / "bin" / "agl-trainer"
    for trainer in trainers.values():
        if not trainer.exists():
            sys.exit(f"no agl-trainer at {trainer}")
    results: dict[str, list[dict[str, float]]] = {name: [] for name in trainers}
    with tempfile.TemporaryDirectory(prefix="agl-launch-bench-") as tmp:
        root = Path(tmp)
        model_dir = build_model(root / "model")
        with contextlib.ExitStack() as stack_exit:
            engine = stack_exit.enter_context(run_engine(model_dir, model_name=cpu_stack.MODEL, log_dir=root))
            chat(engine, "warm up")
            stack = stack_exit.enter_context(cpu_stack.start(root / "stack", engine))
            tasks = cpu_stack.write_tasks(root / "tasks.jsonl", ["parity", "parity"])
            for i in range(args.runs):
                for name, trainer in trainers.items():
                    engine.restore_base_weights()
                    phases = launch(trainer, stack, engine, f"launch-{name}-{i}", tasks)
                    results[name].append(phases)
                    print(f"{name} run {i}: " + " ".join(f"{p}={phases[p]:.1f}" for p in PHASES), flush=True)
    medians = {name: report(name, runs) for name, runs in results.items()}
    if "baseline" in medians:
        for phase in ("ray_up", "first_step", "exit"):
            print(f"{phase}: this / baseline = {medians['this'][phase] / medians['baseline'][phase]:.2f}")


if __name__ == "__main__":
    main()
