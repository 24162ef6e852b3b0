"""GRPO recipe lab: the demo's task, tiny model and warm start, trained in one process without the services.

Searching a recipe through the whole stack costs ~6 s a step; this loop costs ~0.5 s, so lr, batch shape
and warm start can be compared over 150 steps in about a minute each. It is the same objective as the
trainer's step with one update per step (on-policy, so PPO's ratio is 1 and its clip inactive): sample
`--n` answers per task at the train temperature, reward them with the math agent's own `score`, GRPO
advantages (group mean, divided by the group std unless `--no-std`), the `per_rollout_mean` loss (each
rollout's token-mean log-prob times its advantage, averaged over rollouts), AdamW with grad-norm clip 1.0.
It does not replace bench/training_bench.py, which measures the real system; it picks what that runs.

    .venv/bin/python bench/grpo_recipe_lab.py [--lr 1e-4] [--tasks-per-step 16] [--n 4] [--steps 150] [--lora-rank 8]

Prints one JSON line per evaluation: held-out and training greedy accuracy, the mean sampled reward.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from examples.math_agent.agent import score  # noqa: E402
from examples.math_agent.tasks import messages, split_tasks, tokenizer_corpus  # noqa: E402
from services.engine.tiny_model import EOS_TOKEN, build_tiny_model  # noqa: E402
from services.engine.warm_start import warm_start  # noqa: E402


def encode_prompts(tokenizer: Any, tasks: Sequence[dict[str, Any]]) -> list[list[int]]:
    """Each task's chat rendered by the model's template, as the engine renders the agent's call."""
    out = []
    for task in tasks:
        text = tokenizer.apply_chat_template(messages(task), add_generation_prompt=True, tokenize=False)
        out.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return out


@torch.no_grad()
def sample(model: Any, prompts: list[list[int]], *, temperature: float, max_new: int, eos: int, pad: int):
    """Responses (token lists, up to and including EOS) for left-padded prompts; temperature 0 is greedy."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    options: dict[str, Any] = {"max_new_tokens": max_new, "eos_token_id": eos, "pad_token_id": pad}
    if temperature > 0:
        options.update(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
    else:
        options.update(do_sample=False)
    generated = model.generate(input_ids=ids, attention_mask=attention, **options)[:, width:].tolist()
    responses = []
    for row in generated:
        cut = row.index(eos) + 1 if eos in row else len(row)
        responses.append(row[:cut])
    return responses


def rewards_of(tokenizer: Any, responses: list[list[int]], tasks: Sequence[dict[str, Any]]) -> list[float]:
    """The math agent's own reward for each decoded response."""
    decoded = [tokenizer.decode(r, skip_special_tokens=True) for r in responses]
    return [score(text, task["answer"]) for text, task in zip(decoded, tasks, strict=True)]


def greedy_accuracy(
    model: Any, tokenizer: Any, tasks: Sequence[dict[str, Any]], prompts, eos: int, max_new: int = 8
) -> float:
    model.eval()
    replies = sample(model, prompts, temperature=0, max_new=max_new, eos=eos, pad=tokenizer.pad_token_id)
    return sum(rewards_of(tokenizer, replies, tasks)) / len(tasks)


def grpo_loss(
    model: Any, prompts, responses, advantages: torch.Tensor, pad: int, temperature: float, ref: Any = None, kl=0.0
):
    """per_rollout_mean: mean over rollouts of (advantage x the rollout's token-mean log-prob), negated; with a
    reference model, plus kl x the rollouts' mean token KL to it (verl's use_kl_loss, low_var_kl)."""
    sequences = [p + r for p, r in zip(prompts, responses, strict=True)]
    width = max(len(s) for s in sequences)
    ids = torch.tensor([s + [pad] * (width - len(s)) for s in sequences])
    attention = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in sequences])
    mask = torch.zeros(ids.shape, dtype=torch.float32)
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        mask[i, len(p) : len(p) + len(r)] = 1

    def token_log_probs(net: Any) -> torch.Tensor:
        logits = net(input_ids=ids, attention_mask=attention).logits[:, :-1] / temperature
        return torch.gather(F.log_softmax(logits, -1), 2, ids[:, 1:].unsqueeze(-1)).squeeze(-1)

    log_probs = token_log_probs(model)
    response = mask[:, 1:]
    tokens = response.sum(1).clamp(min=1)
    loss = -(advantages * (log_probs * response).sum(1) / tokens).mean()
    if ref is not None and kl > 0:
        with torch.no_grad():
            ref_log_probs = token_log_probs(ref)
        ratio = (ref_log_probs - log_probs).clamp(-20, 20)
        token_kl = (ratio.exp() - ratio - 1).clamp(-10, 10)  # low_var_kl: the k3 estimator, clamped as verl does
        loss = loss + kl * ((token_kl * response).sum(1) / tokens).mean()
    return loss


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-operand", type=int, default=19)
    parser.add_argument("--train-tasks", type=int, default=336)
    parser.add_argument("--val-tasks", type=int, default=64)
    parser.add_argument("--warm-start-steps", type=int, default=300, help="the demo's (tools/demo_agents.py)")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--tasks-per-step", type=int, default=16)
    parser.add_argument("--n", type=int, default=4, help="rollouts per task (GRPO group size)")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--no-std", action="store_true", help="advantages not divided by the group std")
    parser.add_argument("--weight-decay", type=float, default=0.01, help="verl's actor default")
    parser.add_argument("--warmup-steps", type=int, default=0, help="linear lr warm-up, in updates (the demo: 10)")
    parser.add_argument(
        "--lr-schedule", choices=("constant", "cosine"), default="constant", help="after the warm-up (verl's names)"
    )
    parser.add_argument("--min-lr-ratio", type=float, default=0.0, help="cosine: the last update's lr over --lr")
    parser.add_argument(
        "--lora-rank", type=int, default=0, help="train a LoRA adapter (alpha 2 x rank, every linear layer: verl's)"
    )
    parser.add_argument("--kl-coef", type=float, default=0.0, help="KL loss to the warm start (verl's kl_loss_coef)")
    parser.add_argument("--eval-every", type=int, default=25)
    # The stack's agent asks for up to 64 tokens (examples/math_agent/agent.py) in training and validation alike; a
    # shorter cut hides what the policy says after its answer, and the math agent scores the reply's last number.
    parser.add_argument("--max-new", type=int, default=16, help="tokens sampled per training answer (the agent: 64)")
    parser.add_argument("--eval-max-new", type=int, default=8, help="tokens of a greedy eval answer (the agent: 64)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--models-dir", type=Path, default=REPO / "data" / "lab-models")
    parser.add_argument(
        "--model", type=Path, default=None, help="start from this model (the demo's: data/models/tiny-math-*)"
    )
    return parser.parse_args(argv)


def lr_factor(args: argparse.Namespace, done: int) -> float:
    """The lr after `done` steps, over --lr: linear warm-up, then constant or a half cosine to --min-lr-ratio."""
    if done < args.warmup_steps:
        return (done + 1) / args.warmup_steps
    if args.lr_schedule == "constant":
        return 1.0
    progress = min(1.0, (done - args.warmup_steps) / max(1, args.steps - args.warmup_steps))
    return args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def warm_model(args: argparse.Namespace, train: Sequence[dict[str, Any]]) -> Path:
    """The demo's recipe (hidden 128, 4 layers, the same warm start), made once per setting."""
    name = f"ops{args.max_operand}-train{args.train_tasks}-val{args.val_tasks}-warm{args.warm_start_steps}"
    path = args.models_dir / name
    if not (path / "lab-ready").exists():
        build_tiny_model(path, hidden=128, layers=4, corpus=tokenizer_corpus(train))
        examples = [(messages(t), t["answer"]) for t in train]
        result = warm_start(path, examples, steps=args.warm_start_steps, threads=1)
        (path / "lab-ready").write_text(f"{result.loss}\n")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)  # two lab runs side by side on 2 cores
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    train, val = split_tasks(args.train_tasks, args.val_tasks, seed=7, max_operand=args.max_operand)
    path = args.model or warm_model(args, train)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
    reference = None
    if args.kl_coef > 0:
        reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").eval()
    if args.lora_rank:
        from peft import LoraConfig, get_peft_model

        adapter = LoraConfig(r=args.lora_rank, lora_alpha=2 * args.lora_rank, target_modules="all-linear")
        model = get_peft_model(model, adapter)
    eos, pad = tokenizer.convert_tokens_to_ids(EOS_TOKEN), tokenizer.pad_token_id
    train_prompts, val_prompts = encode_prompts(tokenizer, train), encode_prompts(tokenizer, val)
    probe = min(128, len(train))
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=args.lr, weight_decay=args.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda done: lr_factor(args, done))

    def report(step: int, rewards: list[float]) -> None:
        line: dict[str, Any] = {
            "step": step,
            "held_out": greedy_accuracy(model, tokenizer, val, val_prompts, eos, args.eval_max_new),
            "train": greedy_accuracy(model, tokenizer, train[:probe], train_prompts[:probe], eos, args.eval_max_new),
        }
        if rewards:
            line["reward_mean"] = round(sum(rewards) / len(rewards), 3)
        print(json.dumps(line), flush=True)

    report(0, [])
    order: list[int] = []
    recent: list[float] = []
    started = time.monotonic()
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
        responses = sample(model, prompts, temperature=args.temperature, max_new=args.max_new, eos=eos, pad=pad)
        rewards = rewards_of(tokenizer, responses, tasks)
        recent.append(sum(rewards) / len(rewards))
        groups = torch.tensor(rewards).view(args.tasks_per_step, args.n)
        advantages = groups - groups.mean(1, keepdim=True)
        if not args.no_std:
            advantages = advantages / (groups.std(1, keepdim=True) + 1e-6)
        advantages = advantages.view(-1)
        if advantages.abs().sum() > 0:  # no signal: no update (Adam's momentum would still move the weights)
            model.train()
            grpo_loss(model, prompts, responses, advantages, pad, args.temperature, reference, args.kl_coef).backward()
            torch.nn.utils.clip_grad_norm_(trained, 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        schedule.step()  # by step, as verl's scheduler (one update per step there)
        if step % args.eval_every == 0:
            report(step, recent)
            recent = []
    print(json.dumps({"seconds": round(time.monotonic() - started, 1)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
