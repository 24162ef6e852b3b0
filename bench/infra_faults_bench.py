"""Infrastructure faults vs learning: does a run that loses a fifth of its rollouts to kills learn like a clean one?

The demo's task, tiny model and warm start in one process (bench/grpo_recipe_lab.py's loop: sample `--n` answers
per task, the math agent's reward, GRPO, the per_rollout_mean loss, AdamW), three arms from the same warm start and
seed, each step's selection and advantages done by the trainer's own code (infra_policy.select, build_rows,
rollout_advantages with verl's GRPO):
  clean:         no faults
  score:         `--kill` of the rollouts (at random) are killed after their model call: they keep their answer
                 and train with the fill-value reward 0 (AGL's behaviour before the policy; `policy=score`)
  drop_rollout:  the same kills, left out of their groups (the trainer's policy once its retries are spent)
  retry_drop:    the trainer's default whole: a killed rollout is attempted again (a fresh sample of the same
                 prompt, killed at the same rate: `agl.infra_failures.retry_attempts=2`), then left out if
                 killed again
A killed answer that was right is scored 0 under `score`: its group learns that the right answer is wrong.

    .venv/bin/python bench/infra_faults_bench.py [--steps 150] [--kill 0.2] [--seed 0] [--warm-start-steps 300]

Prints one JSON line per evaluation and arm, then a summary of held-out greedy accuracy by arm.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import grpo_recipe_lab as lab  # noqa: E402
import torch  # noqa: E402

from examples.math_agent.tasks import split_tasks  # noqa: E402
from services.engine.tiny_model import EOS_TOKEN  # noqa: E402
from services.trainer.data.adapter import DataPathSettings, build_rows  # noqa: E402
from services.trainer.data.advantage import rollout_advantages  # noqa: E402
from services.trainer.data.infra_policy import InfraSettings, Policy, select  # noqa: E402
from services.trainer.data.triplets import RolloutTrace, Triplet  # noqa: E402

ARMS = {"clean": None, "score": Policy.SCORE, "drop_rollout": Policy.DROP_ROLLOUT, "retry_drop": Policy.DROP_ROLLOUT}
ATTEMPTS = {"retry_drop": 2}  # attempts per rollout (the trainer's default); the other arms have one


def step_advantages(
    chosen: list[int], n: int, rewards: list[float], killed: set[int], policy: Policy | None
) -> dict[int, float]:
    """Advantage by rollout index (left-out rollouts absent), through the trainer's selection and advantages."""
    traces = []
    for index, reward in enumerate(rewards):
        dead = index in killed
        traces.append(
            RolloutTrace(
                rollout_id=str(index),
                group_id=f"g{chosen[index // n]}-{index // n}",
                data_id=str(chosen[index // n]),
                reward=0.0 if dead else reward,  # a killed agent posted no reward: the fill value
                triplets=[Triplet([1], [2], None, 0)],  # it had made its call
                reward_missing=dead,
                succeeded=not dead,
                failure_reason="KILLED" if dead else "",
            )
        )
    kept = traces if policy is None else select(traces, InfraSettings(policy=policy), n).kept
    rows = build_rows(kept, DataPathSettings(), Counter())
    return {int(k): v for k, v in rollout_advantages(rows, "grpo").items()}


def run_arm(args: argparse.Namespace, name: str, policy: Policy | None, path: Path, train, val) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    faults = random.Random(args.seed + 1)  # the same kills in both faulty arms while their samples agree
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
    eos, pad = tokenizer.convert_tokens_to_ids(EOS_TOKEN), tokenizer.pad_token_id
    train_prompts, val_prompts = lab.encode_prompts(tokenizer, train), lab.encode_prompts(tokenizer, val)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    curve = [(0, lab.greedy_accuracy(model, tokenizer, val, val_prompts, eos))]
    order: list[int] = []
    killed_total = wrong_zeros = left_out = 0
    for step in range(1, args.steps + 1):
        chosen = []
        for _ in range(args.tasks_per_step):
            if not order:
                order = list(range(len(train)))
                rng.shuffle(order)
            chosen.append(order.pop())
        prompts = [train_prompts[i] for i in chosen for _ in range(args.n)]
        tasks = [train[i] for i in chosen for _ in range(args.n)]
        model.eval()
        responses = lab.sample(model, prompts, temperature=1.0, max_new=16, eos=eos, pad=pad)
        rewards = lab.rewards_of(tokenizer, responses, tasks)
        killed = {i for i in range(len(rewards)) if faults.random() < args.kill} if policy is not None else set()
        killed_total += len(killed)
        for _ in range(ATTEMPTS.get(name, 1) - 1):  # a retry is a fresh attempt: a new answer, maybe killed again
            again = sorted(killed)
            if not again:
                break
            fresh = lab.sample(model, [prompts[i] for i in again], temperature=1.0, max_new=16, eos=eos, pad=pad)
            fresh_rewards = lab.rewards_of(tokenizer, fresh, [tasks[i] for i in again])
            for i, response, reward in zip(again, fresh, fresh_rewards, strict=True):
                responses[i], rewards[i] = response, reward
            killed = {i for i in again if faults.random() < args.kill}
        wrong_zeros += sum(1 for i in killed if rewards[i] > 0)
        left_out += len(killed)
        by_index = step_advantages(chosen, args.n, rewards, killed, policy)
        if by_index and any(v != 0 for v in by_index.values()):
            keep = sorted(by_index)
            model.train()
            advantages = torch.tensor([by_index[i] for i in keep], dtype=torch.float32)
            loss = lab.grpo_loss(model, [prompts[i] for i in keep], [responses[i] for i in keep], advantages, pad, 1.0)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        if step % args.eval_every == 0:
            curve.append((step, lab.greedy_accuracy(model, tokenizer, val, val_prompts, eos)))
            print(json.dumps({"arm": name, "step": step, "held_out": curve[-1][1]}), flush=True)
    return {
        "arm": name,
        "curve": curve,
        "killed": killed_total,
        "killed_on_the_last_attempt": left_out,
        "right_answers_scored_0": wrong_zeros,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--tasks-per-step", type=int, default=16)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--kill", type=float, default=0.2, help="share of rollouts killed after their call")
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--warm-start-steps", type=int, default=300, help="warm-start steps (the demo's 300)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    lab_args = lab.parse(["--warm-start-steps", str(args.warm_start_steps)])
    train, val = split_tasks(lab_args.train_tasks, lab_args.val_tasks, seed=7, max_operand=lab_args.max_operand)
    path = lab.warm_model(lab_args, train)
    results = []
    for name in args.arms.split(","):
        started = time.monotonic()
        result = run_arm(args, name, ARMS[name], path, train, val)
        result["seconds"] = round(time.monotonic() - started, 1)
        results.append(result)
    print("== held-out greedy accuracy by step ==")
    for result in results:
        points = "  ".join(f"{s}:{a:.3f}" for s, a in result["curve"])
        zeros = result["right_answers_scored_0"] if result["arm"] == "score" else "-"
        print(f"{result['arm']:>13}  {points}  (killed {result['killed']}, on the last attempt "
              f"{result['killed_on_the_last_attempt']}, right answers scored 0: {zeros}; "
              f"{result['seconds']} s)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
