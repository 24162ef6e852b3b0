"""Addition tasks for the math agent, generated (no download): `What is 12 + 7?` -> `19`.

Used by `make demo` and bench/training_bench.py to train the tiny model, and to warm-start it: the
warm start renders each task exactly as the agent asks it (its system prompt, then the question).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .agent import SYSTEM_PROMPT


def make_tasks(count: int, *, seed: int, max_operand: int = 49, prefix: str = "add") -> list[dict[str, Any]]:
    """`count` distinct tasks (fewer if the operand range has fewer pairs), deterministic for a seed."""
    rng = random.Random(seed)
    pairs: list[tuple[int, int]] = []
    seen: set[tuple[int, int]] = set()
    limit = (max_operand + 1) ** 2
    while len(pairs) < min(count, limit):
        pair = (rng.randint(0, max_operand), rng.randint(0, max_operand))
        if pair not in seen:
            seen.add(pair)
            pairs.append(pair)
    return [
        {"id": f"{prefix}-{i:05d}", "question": f"What is {a} + {b}?", "answer": str(a + b)}
        for i, (a, b) in enumerate(pairs)
    ]


def split_tasks(
    count: int, held_out: int, *, seed: int, max_operand: int = 49
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Training tasks and a held-out set that shares no question with them."""
    tasks = make_tasks(count + held_out, seed=seed, max_operand=max_operand)
    train = [dict(t, id=f"train-{i:05d}") for i, t in enumerate(tasks[:count])]
    val = [dict(t, id=f"val-{i:05d}") for i, t in enumerate(tasks[count:])]
    return train, val


def messages(task: dict[str, Any]) -> list[dict[str, str]]:
    """The chat the agent sends for this task."""
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": task["question"]}]


def tokenizer_corpus(tasks: Sequence[dict[str, Any]]) -> list[str]:
    """Text to learn the tiny tokenizer's merges from: the prompt parts and answers the agent will send."""
    return [SYSTEM_PROMPT] * 8 + [t["question"] for t in tasks] + [t["answer"] for t in tasks]


def write_jsonl(path: Path, tasks: Sequence[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return path
