"""`agl train --sft-data`: a supervised start from examples before RL.

RL learns only from groups whose rewards differ, so a policy that is never right (a random tiny model, a model
that does not know the task's format) gives GRPO nothing. A few hundred supervised steps on examples of the
answers wanted make a policy that is sometimes right; RL sharpens it. The examples are a JSONL file; a line is
one of:
- `{"messages": [...], "answer": "..."}`: the chat the agent sends and the reply wanted;
- `{"messages": [..., {"role": "assistant", "content": "..."}]}`: a transcript, one example per assistant turn
  (the turn is the answer, the messages before it the prompt);
- `{"prompt": "...", "answer": "..."}`: the prompt as the user's one message;
- a line of an earlier run's `trajectories.jsonl`: every model call of a training rollout with reward >= 1 (a
  success), its prompt as the model saw it (already rendered by the chat template).
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from ..errors import USAGE, CliError
from . import options

Messages = list[dict[str, Any]]
# A trajectory's rollout counts as a success from this reward up.
SUCCESS_REWARD = 1.0
STAMP_FILE = "agl_supervised_start.json"


@dataclass(frozen=True)
class Example:
    prompt: Messages | str  # chat messages, or a prompt the chat template already rendered
    answer: str


@dataclass(frozen=True)
class SupervisedSettings:
    steps: int
    lr: float
    batch_size: int


def default_settings(model: str, examples: int, steps: int | None, lr: float | None) -> SupervisedSettings:
    """The tiny model starts from random weights: 300 steps at 1e-3 (what the math demo's start takes). A real
    model already speaks: three passes over the examples at 1e-5, so a few dozen examples are not memorised."""
    batch_size = min(32, examples)
    if model == options.TINY_MODEL:
        return SupervisedSettings(steps or 300, lr if lr is not None else 1e-3, batch_size)
    real_steps = steps or max(1, math.ceil(3 * examples / batch_size))
    return SupervisedSettings(real_steps, lr if lr is not None else 1e-5, batch_size)


def load_examples(path: Path) -> list[Example]:
    """Every example in the file; a line that is none of the shapes above is one error naming it."""
    if not path.is_file():
        raise CliError(f"--sft-data {path}: no such file", USAGE)
    examples: list[Example] = []
    with path.open() as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as err:
                raise CliError(f"--sft-data {path} line {number}: not JSON ({err})", USAGE) from None
            try:
                examples.extend(_examples_of(record))
            except ValueError as err:
                raise CliError(f"--sft-data {path} line {number}: {err}", USAGE) from None
    if not examples:
        raise CliError(
            f"--sft-data {path}: no example in it (a transcript without an assistant turn, or trajectories "
            f"without a training rollout rewarded {SUCCESS_REWARD:g} or more, gives none)",
            USAGE,
        )
    return examples


def _examples_of(record: Any) -> Iterator[Example]:
    if not isinstance(record, dict):
        raise ValueError("a JSON object is wanted")
    if "calls" in record and "reward" in record:  # a line of trajectories.jsonl
        reward = record.get("reward")
        if record.get("kind", "train") == "train" and isinstance(reward, (int, float)) and reward >= SUCCESS_REWARD:
            for call in record["calls"]:
                if isinstance(call, dict) and isinstance(call.get("prompt"), str) and not call.get("failed"):
                    yield Example(call["prompt"], str(call.get("response", "")))
        return
    if "prompt" in record:
        if not isinstance(record["prompt"], str) or not isinstance(record.get("answer"), str):
            raise ValueError('"prompt" and "answer" must both be strings')
        yield Example([{"role": "user", "content": record["prompt"]}], record["answer"])
        return
    messages = record.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
        raise ValueError('"messages" (a list of chat messages with a "role"), "prompt" or a trajectory is wanted')
    if "answer" in record:
        if not isinstance(record["answer"], str):
            raise ValueError('"answer" must be a string')
        yield Example(messages, record["answer"])
        return
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant" and isinstance(m.get("content"), str)]
    for index in turns:
        if index:
            yield Example(messages[:index], messages[index]["content"])


def example_strings(examples: list[Example]) -> Iterator[str]:
    """Their text, for the tiny model's tokenizer (learned from what it will read and write)."""
    for example in examples:
        if isinstance(example.prompt, str):
            yield example.prompt
        else:
            yield from (str(m.get("content") or "") for m in example.prompt)
        yield example.answer


def stamp(base: Path, examples: list[Example], settings: SupervisedSettings) -> str:
    digest = hashlib.sha256()
    digest.update(str(base.resolve()).encode())
    digest.update(json.dumps([[e.prompt, e.answer] for e in examples], sort_keys=True).encode())
    digest.update(json.dumps([settings.steps, settings.lr, settings.batch_size]).encode())
    return digest.hexdigest()[:16]


def supervised_start(
    base: Path, examples: list[Example], settings: SupervisedSettings, target: Path, out: TextIO
) -> Path:
    """The base model trained on the examples, in target (kept: a resumed run or a rerun uses it again)."""
    from services.engine.warm_start import progress_lines, warm_start

    wanted = stamp(base, examples, settings)
    stamp_path = target / STAMP_FILE
    if stamp_path.is_file() and json.loads(stamp_path.read_text()).get("stamp") == wanted:
        out.write(f"supervised start: {target} (cached)\n")
        return target
    what = f"{len(examples)} examples, {settings.steps} steps of {settings.batch_size} at lr {settings.lr:g}"
    out.write(f"supervised start: {what}\n")
    out.flush()
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(base, partial)
    result = warm_start(
        partial,
        [(example.prompt, example.answer) for example in examples],
        steps=settings.steps,
        batch_size=settings.batch_size,
        lr=settings.lr,
        warmup_steps=min(50, max(1, settings.steps // 5)),
        on_step=progress_lines(out, "supervised start", settings.steps),
    )
    record = {"stamp": wanted, "base": str(base), "examples": len(examples), "loss": round(result.loss, 4)}
    (partial / STAMP_FILE).write_text(json.dumps(record, indent=2) + "\n")
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    out.write(f"supervised start: done in {result.seconds:.0f}s, loss {result.loss:.3f} ({target})\n")
    return target
