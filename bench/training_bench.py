"""Whole-system training benchmark: the demo's stack (ledger, proxy, controller, the unmodified math agent as
processes, the CPU vLLM engine, `agl-trainer placement=cpu`) run twice on the same tasks and warm start:
once learning, once with lr=0 as the control. Reports, from the trainer's own per-step metrics:

  step seconds      median and p90 of a whole GRPO step (target: median <= 3 s for 64 rollouts on 2 cores)
  phases            rollouts (agents + engine), old log-probs, actor update, weight push
  push              reload seconds per engine (target <= 0.2 s) and the largest engine-vs-trainer log-prob
                    gap on the rows sampled after each push (target <= 1e-4)
  learning          held-out greedy accuracy before and after, learning run vs control
                    (target: +0.10 absolute within 150 steps, and above the control)
  multi-turn        (--agent calc: the calc agent's tool calls, 2-digit products) held-out tool-call rate before
                    and after, trajectory breaks and segments per rollout over the run (target: 0 breaks),
                    unparsed tool calls, masked context tokens per row, turns per rollout
                    (target: held-out accuracy +0.15 within 100 steps, above the control)

    .venv/bin/python bench/training_bench.py [--steps 150] [--lr 1e-4] [--skip-control]
    .venv/bin/python bench/training_bench.py --agent calc --steps 100
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tools import demo_train  # noqa: E402


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    demo_train.add_arguments(parser)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--data-dir", type=Path, default=REPO / "data" / "bench")
    parser.add_argument("--output-dir", type=Path, default=REPO / "data" / "bench" / "out")
    parser.add_argument("--skip-control", action="store_true", help="no lr=0 run")
    parser.set_defaults(steps=150, val_every=25)
    return parser.parse_args(argv)


def figures(metrics_path: Path) -> dict[str, Any]:
    records = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    steps = [r["data"] for r in records if r["step"] > 0]

    def series(key: str) -> list[float]:
        return [float(s[key]) for s in steps if key in s]

    def med(key: str) -> float | None:
        values = series(key)
        return statistics.median(values) if values else None

    vals = [(r["step"], r["data"]["val/agl/reward_mean"]) for r in records if "val/agl/reward_mean" in r["data"]]
    rates = [
        (r["step"], r["data"]["val/agl/tools/call_rate"]) for r in records if "val/agl/tools/call_rate" in r["data"]
    ]
    seconds = sorted(series("agl/step/seconds"))
    return {
        "steps": len(steps),
        "step_s_median": statistics.median(seconds) if seconds else None,
        "step_s_p90": seconds[int(0.9 * (len(seconds) - 1))] if seconds else None,
        "rollouts_s_median": med("timing_s/gen"),
        "old_log_prob_s_median": med("timing_s/old_log_prob"),
        "update_s_median": med("timing_s/update_actor"),
        "push_s_median": med("timing_s/update_weights"),
        "reload_s_max": max(series("agl/push/reload_s"), default=None),
        "logprob_gap_max": max(series("agl/push/logprob_diff_max"), default=None),
        "accuracy_by_step": vals,
        "accuracy_before": vals[0][1] if vals else None,
        "accuracy_after": vals[-1][1] if vals else None,
        "reward_first_10": statistics.mean(series("agl/reward/mean")[:10]) if steps else None,
        "reward_last_10": statistics.mean(series("agl/reward/mean")[-10:]) if steps else None,
        "tool_call_rate_by_step": rates,
        "train_tool_call_rate_first_10": statistics.mean(series("agl/tools/call_rate")[:10]) if steps else None,
        "train_tool_call_rate_last_10": statistics.mean(series("agl/tools/call_rate")[-10:]) if steps else None,
        "trajectory_breaks_total": sum(series("agl/data/trajectory_breaks")),
        "segments_per_rollout_max": max(series("agl/data/segments_per_rollout"), default=None),
        "unparsed_tool_calls_total": sum(series("agl/tools/unparsed_calls")),
        "context_tokens_per_row_median": med("agl/data/context_tokens_per_row"),
        "turns_per_rollout_median": med("agl/turns/mean"),
        "rollouts_per_step_median": med("agl/data/rollouts"),
    }


def run(args: argparse.Namespace, lr: float, name: str) -> dict[str, Any]:
    run_args = argparse.Namespace(**vars(args))
    run_args.lr = lr
    run_args.output_dir = args.output_dir / name
    started = time.monotonic()
    with open(args.output_dir.parent / f"{name}.log", "w") as log:
        code = demo_train.run_training(run_args, out=log)
    if code != 0:
        raise SystemExit(f"{name} run failed; see {args.output_dir.parent / f'{name}.log'}")
    result = figures(run_args.output_dir / "metrics.jsonl")
    result["wall_s"] = time.monotonic() - started
    return result


def main() -> int:
    args = parse()
    args.output_dir.mkdir(parents=True, exist_ok=True)
    results = {"learning": run(args, args.lr, "learning")}
    if not args.skip_control:
        results["control_lr0"] = run(args, 0.0, "control")
    print(json.dumps(results, indent=2))
    learn = results["learning"]
    if learn["accuracy_before"] is not None and learn["accuracy_after"] is not None:
        gain = learn["accuracy_after"] - learn["accuracy_before"]
        line = f"held-out accuracy {learn['accuracy_before']:.3f} -> {learn['accuracy_after']:.3f} ({gain:+.3f})"
        if "control_lr0" in results and results["control_lr0"]["accuracy_after"] is not None:
            line += f"; control (lr=0) ends at {results['control_lr0']['accuracy_after']:.3f}"
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
