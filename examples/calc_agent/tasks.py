"""Multiplication tasks for the calc agent, generated (no download): `What is 37 * 84?` -> `3108`.

A task where the tool matters: a ~1 M-parameter model cannot multiply two 2-digit numbers in its head, but it
can copy the operands into a `calculator` call and copy the tool's result into its answer. Used by
`make demo ARGS="--agent calc"` and bench/multiturn_bench.py to train the tiny model, and to warm-start it:
the warm start renders each transcript exactly as the agent sends it (its system prompt, the question, its
tool, the tool call and the tool's result), with the model's own chat template.

The warm start mixes two kinds of transcript so that the starting policy sometimes calls the tool (and is
then often right) and sometimes answers at once (and is then almost always wrong): RL needs both.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from typing import Any

from .agent import CALCULATOR_TOOL, SYSTEM_PROMPT

Messages = list[dict[str, Any]]
TOOLS = [CALCULATOR_TOOL]


def make_tasks(count: int, *, seed: int, low: int = 10, high: int = 99) -> list[dict[str, Any]]:
    """`count` distinct tasks `a * b` with a, b in low..high (fewer if the range has fewer pairs)."""
    rng = random.Random(seed)
    pairs: list[tuple[int, int]] = []
    seen: set[tuple[int, int]] = set()
    limit = (high - low + 1) ** 2
    while len(pairs) < min(count, limit):
        pair = (rng.randint(low, high), rng.randint(low, high))
        if pair not in seen:
            seen.add(pair)
            pairs.append(pair)
    return [
        {"id": f"mul-{i:05d}", "question": f"What is {a} * {b}?", "answer": str(a * b), "expression": f"{a} * {b}"}
        for i, (a, b) in enumerate(pairs)
    ]


def split_tasks(count: int, held_out: int, *, seed: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Training tasks and a held-out set that shares no question with them."""
    tasks = make_tasks(count + held_out, seed=seed)
    train = [dict(t, id=f"train-{i:05d}") for i, t in enumerate(tasks[:count])]
    val = [dict(t, id=f"val-{i:05d}") for i, t in enumerate(tasks[count:])]
    return train, val


def messages(task: dict[str, Any]) -> Messages:
    """The chat the agent opens with for this task."""
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": task["question"]}]


def tool_call_text(expression: str) -> str:
    """A calculator call as the tiny model's template renders it (and vLLM's hermes parser reads it)."""
    arguments = json.dumps({"expression": expression})
    return f'<tool_call>{{"name": "calculator", "arguments": {arguments}}}</tool_call>'


def transcripts(task: dict[str, Any]) -> tuple[list[tuple[Messages, str]], list[tuple[Messages, str]]]:
    """(with the tool, without it): the (messages, assistant reply) pairs of each way of solving the task.

    With the tool: the call, then, after the tool's result, the answer copied from it. Without: the answer at
    once (a supervised model learns to guess; the guess is rarely right)."""
    opening = messages(task)
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call-0",
                "type": "function",
                "function": {"name": "calculator", "arguments": json.dumps({"expression": task["expression"]})},
            }
        ],
    }
    result = {"role": "tool", "tool_call_id": "call-0", "content": task["answer"]}
    with_tool = [(opening, tool_call_text(task["expression"])), ([*opening, call, result], task["answer"])]
    return with_tool, [(opening, task["answer"])]


def warm_start_examples(tasks: Sequence[dict[str, Any]], *, tool_share: float, seed: int) -> list[tuple[Messages, str]]:
    """Every task's transcript, with the tool for a `tool_share` of the tasks and without for the rest."""
    rng = random.Random(seed)
    examples: list[tuple[Messages, str]] = []
    for task in tasks:
        with_tool, without = transcripts(task)
        examples.extend(with_tool if rng.random() < tool_share else without)
    return examples


def tokenizer_corpus(tasks: Sequence[dict[str, Any]]) -> list[str]:
    """Text to learn the tiny tokenizer's merges from: the system prompt, the tool line, the call's fixed JSON,
    the questions. Digits stay one token each (Qwen2's pre-tokenizer splits them)."""
    fixed = [SYSTEM_PROMPT, "tools: calculator(expression)", tool_call_text("1 * 2")]
    return fixed * 8 + [t["question"] for t in tasks]
