"""Weight push, full weights vs a LoRA adapter, on a model large enough to show it (issue 32).

Builds the tiny Qwen2-shaped model at `--hidden`/`--layers` (512 x 8: ~34 M parameters, float32), then runs two
arms one after the other, each on the real stack (ledger, proxy and controller as compose runs them) and its own
CPU vLLM engine, `--steps` steps of the CPU trainer on the parity tasks:
  full:  every weight trains; each push writes the whole safetensors file and the engine reloads it in place
  lora:  `actor_rollout_ref.model.lora_rank=R` (alpha 2R); each push writes the adapter as a PEFT directory and the
         engine (started with --lora-rank R) loads it under the run's model name

Per arm, from the trainer's own step metrics (the steps after the first; step 0's push is the start-up sync):
bytes per push (agl/push/bytes), the actor's write (agl/push/save_s), the engines' reload (agl/push/seconds),
the step time (timing_s/step) and the engine/trainer log-prob gap (agl/push/logprob_diff_max).

    .venv/bin/python bench/lora_push_bench.py [--hidden 512] [--layers 8] [--steps 4] [--rank 8]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.engine import build_model, chat, run_engine  # noqa: E402
from tests.trainer import cpu_stack  # noqa: E402

FIGURES = {
    "bytes": "agl/push/bytes",
    "save_s": "agl/push/save_s",
    "reload_s": "agl/push/seconds",
    "step_s": "timing_s/step",
    "logprob_gap": "agl/push/logprob_diff_max",
}
BASE = "agl-base"  # the LoRA engine's base model name; the adapter is served as the run's model


def run_arm(name: str, model_dir: Path, root: Path, args: argparse.Namespace) -> dict[str, Any]:
    lora = name == "lora"
    engine_args = ["--lora-rank", str(args.rank)] if lora else []
    extra = [f"actor_rollout_ref.model.lora_rank={args.rank}", f"actor_rollout_ref.model.lora_alpha={2 * args.rank}"]
    with contextlib.ExitStack() as stack_exit:
        engine = stack_exit.enter_context(
            run_engine(
                model_dir,
                model_name=BASE if lora else cpu_stack.MODEL,
                args=engine_args,
                log_dir=root / f"engine-{name}",
                start_timeout_s=600,
            )
        )
        chat(engine, "warm up")
        stack = stack_exit.enter_context(cpu_stack.start(root / f"stack-{name}", engine))
        tasks = cpu_stack.write_tasks(root / f"tasks-{name}.jsonl", ["parity"] * 4)
        run = cpu_stack.run_trainer(
            stack, engine, f"push-{name}", tasks, steps=args.steps, lr=1e-3, extra=extra if lora else ()
        )
    if run.returncode != 0:
        sys.exit(f"{name} arm: agl-trainer exited {run.returncode}\n{run.output[-4000:]}")
    steps = [record["data"] for record in run.metrics if record["step"] >= 1]
    figures: dict[str, Any] = {"arm": name, "steps": len(steps)}
    for figure, key in FIGURES.items():
        values = [float(data[key]) for data in steps if key in data]
        figures[figure] = statistics.median(values) if values else None
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--rank", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="agl-lora-push-bench-") as tmp:
        root = Path(tmp)
        model_dir = build_model(root / "model", hidden=args.hidden, layers=args.layers)
        config = json.loads((model_dir / "config.json").read_text())
        weights = sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))
        print(f"model: hidden {args.hidden}, {config['num_hidden_layers']} layers, {weights / 1e6:.1f} MB of weights")
        results = [run_arm(name, model_dir, root, args) for name in ("full", "lora")]
    for r in results:
        print(json.dumps(r))
    full, lora = results

    def cell(value: float | None) -> str:
        return f"{value:12.6g}" if value is not None else f"{'-':>12}"

    print(f"{'':>12} {'full':>12} {'lora':>12} {'lora/full':>10}")
    for figure in FIGURES:
        a, b = full[figure], lora[figure]
        ratio = f"{b / a:10.4f}" if a and b is not None else f"{'':>10}"
        print(f"{figure:>12} {cell(a)} {cell(b)} {ratio}")


if __name__ == "__main__":
    main()
