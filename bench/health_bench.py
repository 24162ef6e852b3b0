"""Step-health benchmark: what the guardrails add to a training step, as a ratio.

Builds the traces of one step in memory (multi-turn rollouts with tool-call stats, some failed, some killed), then
times, best of `--rounds`:
  health:     what the step adds for the guardrails: the infrastructure policy (infra_policy.select), the trace and
              group health, the row health (the per-rollout flags kept while rows are built, and row_health), and
              the limits' evaluation
  data path:  build_training_batch on the same traces (rows, advantages, alignment, tensors), with its row health
and reports health / data path and health / a whole step, the step's time taken from the runs measured in
docs/getting-started/demo.md (the calc agent's median step 10.4 s, the math agent's 4.3 s, both on this 2-core
machine).

    .venv/bin/python bench/health_bench.py [--rollouts 64] [--turns 2] [--rounds 20]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from services._gen.agl.v1 import event_pb2  # noqa: E402
from services.trainer import health  # noqa: E402
from services.trainer.data.adapter import DataPathSettings, build_rows, build_training_batch  # noqa: E402
from services.trainer.data.aggregation import AggregationLevel  # noqa: E402
from services.trainer.data.guardrails import DEFAULT_LIMITS, all_failed_line, evaluate  # noqa: E402
from services.trainer.data.infra_policy import InfraSettings, select  # noqa: E402
from services.trainer.data.triplets import CallOutcome, RolloutTrace, Triplet  # noqa: E402

STEP_SECONDS = {"calc agent (README, median step)": 10.4, "math agent (README, median step)": 4.32}


def make_traces(rollouts: int, turns: int, group_size: int, rng: random.Random) -> list[RolloutTrace]:
    traces = []
    stats = event_pb2.ToolCallStats(offered_tools=1, parsed_calls=1)
    for r in range(rollouts):
        prompt = [rng.randrange(1000, 150000) for _ in range(120)]
        triplets, calls = [], []
        for turn in range(turns):
            response = [rng.randrange(1000, 150000) for _ in range(40)]
            triplets.append(Triplet(list(prompt), response, [-rng.random() for _ in response], turn))
            calls.append(CallOutcome("stop" if rng.random() > 0.1 else "length", stats if turn < turns - 1 else None))
            prompt = prompt + response + [rng.randrange(1000, 150000) for _ in range(12)]
        killed = rng.random() < 0.05
        traces.append(
            RolloutTrace(
                rollout_id=f"bench-s1-g{r // group_size}-r{r % group_size}",
                group_id=f"bench-s1-g{r // group_size}",
                data_id=str(r // group_size),
                reward=float(rng.random() < 0.3),
                triplets=triplets,
                calls=calls,
                succeeded=not killed,
                failure_reason="KILLED" if killed else "",
            )
        )
    return traces


def best(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", type=int, default=64)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    rng = random.Random(0)
    traces = make_traces(args.rollouts, args.turns, args.group_size, rng)
    infra = InfraSettings()
    settings = DataPathSettings(level=AggregationLevel.TRAJECTORY, max_prompt_length=4096, max_response_length=4096)
    kept = select(traces, infra, args.group_size).kept
    rows_counts: Counter[str] = Counter()
    flags = health.RowFlags()
    rows = build_rows(kept, settings, rows_counts, flags)

    def step_health() -> None:
        selection = select(traces, infra, args.group_size)
        found = health.trace_health(traces, infra.reasons)
        found.update(health.group_health(selection.kept, 0))
        all_failed_line(1, traces, infra.reasons)
        found.update(health.row_health(rows, rows_counts, flags))
        evaluate(1, found, health.NAMES, DEFAULT_LIMITS)

    def flags_cost() -> None:  # what keeping the per-rollout flags adds to building the rows
        build_rows(kept, settings, Counter(), health.RowFlags())

    def rows_only() -> None:
        build_rows(kept, settings, Counter(), None)

    health_s = best(step_health, args.rounds)
    flags_s = max(best(flags_cost, args.rounds) - best(rows_only, args.rounds), 0.0)
    data_s = best(lambda: build_training_batch(kept, settings, rng=random.Random(0), counts=Counter()), args.rounds)
    total = health_s + flags_s
    print(f"{args.rollouts} rollouts x {args.turns} turns, groups of {args.group_size}, best of {args.rounds}")
    print(f"health (policy, trace/group/row health, limits): {health_s * 1e3:.3f} ms")
    print(f"row flags while building rows:                   {flags_s * 1e3:.3f} ms")
    print(f"data path (build_training_batch):                {data_s * 1e3:.3f} ms")
    print(f"health / data path: {total / data_s:.2%}")
    for name, seconds in STEP_SECONDS.items():
        print(f"health / step of the {name}: {total / seconds:.4%}")


if __name__ == "__main__":
    main()
