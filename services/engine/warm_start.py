"""A short supervised warm start for the tiny model: next-token loss on the answer tokens only.

RL needs a policy that is sometimes right: a random model never earns a reward. A few hundred Adam steps on
the task's (prompt, answer) pairs make a partly right policy in seconds on 2 cores; RL then sharpens it.
Prompts are rendered with the model's own chat template, exactly as the engine renders the agent's calls.
"""

from __future__ import annotations

import copy
import json
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from .tiny_model import EOS_TOKEN, RECIPE_FILE, make_readable

Messages = list[dict[str, Any]]


# Steps between two looks at the machine's load (threads_for_load).
LOAD_CHECK_EVERY = 25


def threads_for_load(own_threads: int) -> int:
    """Every core when nothing else runs, one when other work does. The model is tiny, so its kernels are short
    and each step synchronises the threads many times: a thread that loses its core to another process stalls
    the rest. Measured on 2 cores at a load average of 7-10 (other tests' engines and trainers): 1 thread 1.5-1.8
    s a step, 2 threads 5.5-7.9 s (2.2 s with OMP_WAIT_POLICY=PASSIVE). `own_threads`: this process's share of
    the 1-minute load average (its threads while it trains), left out of the comparison."""
    cores = len(os.sched_getaffinity(0))
    others = os.getloadavg()[0] - own_threads
    return cores if others < 0.5 else 1


def progress_lines(out: TextIO, label: str, total: int, *, may_stop: bool = False) -> Callable[[int, float], None]:
    """An `on_step` for warm_start: a line every tenth of `total` steps with the loss and the time left (a start
    can take minutes on a loaded machine; one silent line for all of it reads as a hang). `may_stop`: a probe may
    end the run before `total`, so the time left is an upper bound."""
    started = time.monotonic()
    every = max(1, total // 10)

    def progress(step: int, loss: float) -> None:
        if step % every == 0 or step == total:
            left = (time.monotonic() - started) / step * (total - step)
            bound = " at most" if may_stop else ""
            out.write(f"{label}: step {step}/{total}, loss {loss:.3f}, ~{left:.0f}s left{bound}\n")
            out.flush()

    return progress


@dataclass(frozen=True)
class WarmStartResult:
    steps: int
    loss: float
    seconds: float


def _encode(
    tokenizer: Any, messages: Messages | str, answer: str, eos_id: int, tools: Sequence[dict[str, Any]] | None
) -> tuple[list[int], list[int]]:
    """A string is a prompt already rendered by the model's chat template (a call kept from an earlier run)."""
    if isinstance(messages, str):
        text = messages
    else:
        text = tokenizer.apply_chat_template(
            messages, tools=list(tools) if tools else None, add_generation_prompt=True, tokenize=False
        )
    prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
    response = tokenizer(answer, add_special_tokens=False)["input_ids"] + [eos_id]
    return prompt + response, [-100] * len(prompt) + response


def end_of_turn_id(tokenizer: Any) -> int:
    """The token that ends an answer: the tiny model's end-of-turn marker, else the tokenizer's end of sequence
    (an instruct model's end of turn, e.g. Qwen's <|im_end|>)."""
    token_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    if token_id is not None and token_id != tokenizer.unk_token_id:
        return int(token_id)
    if tokenizer.eos_token_id is None:
        raise ValueError(f"the tokenizer has neither {EOS_TOKEN} nor an end-of-sequence token to end an answer")
    return int(tokenizer.eos_token_id)


def warm_start(
    model_dir: Path | str,
    examples: Sequence[tuple[Messages | str, str]],
    *,
    steps: int = 300,
    batch_size: int = 64,
    lr: float = 1e-3,
    warmup_steps: int = 50,
    seed: int = 1,
    threads: int | None = None,
    tools: Sequence[dict[str, Any]] | None = None,
    probe: Callable[[Any, Any, int], float] | None = None,
    stop_band: tuple[float, float] = (0.0, 1.0),
    check_every: int = 25,
    min_steps: int = 0,
    on_step: Callable[[int, float], None] | None = None,
) -> WarmStartResult:
    """Trains the model in model_dir in place on (messages, answer) pairs and saves it back. `tools` (OpenAI
    function tools) are rendered into every prompt, as the engine renders a request that offers them. `threads`:
    torch's intra-op threads; None follows the machine's load (threads_for_load).
    `probe(model, tokenizer, steps_trained)` scores the model (in eval mode) every `check_every` steps from
    `min_steps` on: a score within `stop_band` ends the run (`steps` is then the most it trains). A score above
    the band (the model went past it between two checks) takes the model and its optimizer back to the previous
    check, once, and goes on checking five times as often; past it again, the run stops there.
    `on_step(steps_trained, loss)` is called after every step (progress)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # a bar per load and save: noise around the demo's own lines

    if not examples:
        raise ValueError("warm start needs at least one example")
    chosen_threads = threads or threads_for_load(0)
    torch.set_num_threads(chosen_threads)
    torch.manual_seed(seed)
    out = Path(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="sdpa")
    eos_id = end_of_turn_id(tokenizer)
    encoded = [_encode(tokenizer, messages, answer, eos_id, tools) for messages, answer in examples]
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    # A linear warm-up: a random tiny model at full lr from step 0 stalls on a ~1.0 loss plateau.
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / max(warmup_steps, 1)))
    rng = random.Random(seed)
    started = time.perf_counter()
    loss_value = float("nan")
    model.train()
    step, every, last_check, refined = 0, check_every, -1, False
    snapshot: tuple[int, dict[str, Any], dict[str, Any], dict[str, Any]] | None = None
    while step < steps:
        if probe is not None and step and step >= min_steps and step % every == 0 and step != last_check:
            model.eval()
            score = probe(model, tokenizer, step)
            model.train()
            last_check = step
            low, high = stop_band
            if low <= score <= high or (score > high and (refined or snapshot is None)):
                break
            if score > high and snapshot is not None:
                step, weights, moments, lr_state = snapshot
                model.load_state_dict(weights)
                optimizer.load_state_dict(moments)
                schedule.load_state_dict(lr_state)
                every, refined, last_check = max(1, check_every // 5), True, step  # step: the check taken back to
                continue
            snapshot = (
                step,
                copy.deepcopy(model.state_dict()),
                copy.deepcopy(optimizer.state_dict()),
                schedule.state_dict(),
            )
        if threads is None and step and step % LOAD_CHECK_EVERY == 0:
            chosen_threads = threads_for_load(chosen_threads)
            torch.set_num_threads(chosen_threads)
        chosen = [encoded[rng.randrange(len(encoded))] for _ in range(batch_size)]
        width = max(len(ids) for ids, _ in chosen)
        pad = tokenizer.pad_token_id
        input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in chosen])
        labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in chosen])
        attention = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in chosen])
        loss = model(input_ids=input_ids, attention_mask=attention, labels=labels).loss
        loss.backward()
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        loss_value = float(loss.detach())
        step += 1
        if on_step is not None:
            on_step(step, loss_value)
    trained = step
    seconds = time.perf_counter() - started
    model.save_pretrained(out, safe_serialization=True)
    make_readable(out)
    recipe_path = out / RECIPE_FILE
    recipe = json.loads(recipe_path.read_text()) if recipe_path.exists() else {}
    recipe["warm_start"] = {
        "steps": trained,
        "max_steps": steps,
        "batch_size": batch_size,
        "lr": lr,
        "warmup_steps": warmup_steps,
        "seed": seed,
        # The thread count changes the float path and so the model (null: chosen by the load, step by step).
        "threads": threads,
        "examples": len(examples),
        "seconds": round(seconds, 1),
        "tools": [tool.get("function", tool).get("name") for tool in tools or []],
    }
    recipe_path.write_text(json.dumps(recipe, indent=2) + "\n")
    return WarmStartResult(trained, loss_value, seconds)
