"""The quality of a starting point: what a model does with an agent's tasks before RL touches it.

GRPO learns only from groups whose rollouts disagree (a group all right or all wrong has zero advantage), so a
warm start is judged by what RL will see: greedy accuracy on held-out tasks, how often the first turn calls a
tool, and the share of sampled groups with mixed rewards on training tasks. The episodes are the agent's own
loop, played in-process with Hugging Face `generate` on the chat template the engine renders, each turn
stopping where the engine's does (end of turn or a tool call's closing marker) and tool calls read as vLLM's
hermes parser reads them. Rules over these figures say whether a start can learn (`refusal`).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .tiny_model import EOS_TOKEN, RECIPE_FILE, TOOL_CALL_END, TOOL_CALL_START
from .warm_start import threads_for_load

Messages = list[dict[str, Any]]
Task = dict[str, Any]
# What an agent does with a model's reply: the messages of the next turn, or the episode's reward.
Next = tuple[Messages | None, float]
_CALL = re.compile(re.escape(TOOL_CALL_START) + r"(.*?)" + re.escape(TOOL_CALL_END), re.DOTALL)


@dataclass(frozen=True)
class AgentLoop:
    """An agent's loop as plain functions: its opening chat, its tools and what it does with a reply
    (an OpenAI-shaped assistant message): the next turn's messages, or None and the reward."""

    opening: Callable[[Task], Messages]
    tools: list[dict[str, Any]] | None
    step: Callable[[Task, Messages, dict[str, Any]], Next]
    max_turns: int = 1


@dataclass(frozen=True)
class StartQuality:
    held_out_accuracy: float
    held_out_tasks: int
    # The share of held-out greedy episodes whose first turn calls a tool (None: the agent offers none).
    tool_call_rate: float | None
    # Of `groups` training tasks sampled `group_size` times at `temperature`: the share with mixed rewards.
    mixed_group_share: float
    sampled_reward: float
    groups: int
    group_size: int
    temperature: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class StartRules:
    """What a start must show for GRPO to learn from it. The defaults refuse a start that gives almost no gradient
    (under 1 group in 20 with mixed rewards: 3 of 64, as a start that has learned nothing gets by chance) and one
    that is never right greedily. The demos' working starts show 0.2-0.4 and 0.2 (docs/getting-started/demo.md)."""

    min_mixed_group_share: float = 0.05
    min_held_out_accuracy: float = 0.02


def refusal(quality: StartQuality, rules: StartRules = StartRules()) -> str | None:
    """One line naming the figure and the rule it breaks, or None when the start can learn."""
    if quality.mixed_group_share < rules.min_mixed_group_share:
        return (
            f"mixed-reward groups {quality.mixed_group_share:.3f} ({quality.groups} tasks x {quality.group_size} "
            f"samples) under the minimum {rules.min_mixed_group_share:.3f}: GRPO has no group to learn from"
        )
    if quality.held_out_accuracy < rules.min_held_out_accuracy:
        return (
            f"held-out accuracy {quality.held_out_accuracy:.3f} ({quality.held_out_tasks} tasks) under the minimum "
            f"{rules.min_held_out_accuracy:.3f}: the start is never right"
        )
    return None


def parse_reply(text: str) -> dict[str, Any]:
    """An assistant message from generated text, as the hermes parser reads it: calls whose JSON parses become
    tool_calls, the text before the first call is the content; a reply with no parsable call is all content."""
    calls = []
    for index, body in enumerate(_CALL.findall(text)):
        try:
            call = json.loads(body)
            name, arguments = call["name"], call.get("arguments", {})
        except (json.JSONDecodeError, KeyError, TypeError):
            continue
        calls.append(
            {
                "id": f"call-{index}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
        )
    if not calls:
        return {"role": "assistant", "content": text}
    return {"role": "assistant", "content": text.split(TOOL_CALL_START, 1)[0] or None, "tool_calls": calls}


class _Generator:
    """Batched turns of one model: left-padded prompts, stopping at the engine's stop tokens."""

    def __init__(self, model: Any, tokenizer: Any, max_new_tokens: int) -> None:
        import torch

        self.torch = torch
        self.model, self.tokenizer = model, tokenizer
        self.stops = [tokenizer.convert_tokens_to_ids(t) for t in (EOS_TOKEN, TOOL_CALL_END)]
        self.max_new_tokens = max_new_tokens

    @classmethod
    def load(cls, model_dir: Path, max_new_tokens: int) -> _Generator:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
        model.eval()
        return cls(model, tokenizer, max_new_tokens)

    def replies(self, chats: Sequence[Messages], tools: list[dict[str, Any]] | None, temperature: float) -> list[str]:
        tokenizer, torch = self.tokenizer, self.torch
        prompts = []
        for chat in chats:
            text = tokenizer.apply_chat_template(chat, tools=tools, add_generation_prompt=True, tokenize=False)
            prompts.append(tokenizer(text, add_special_tokens=False)["input_ids"])
        width, pad = max(len(p) for p in prompts), tokenizer.pad_token_id
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        options: dict[str, Any] = {"max_new_tokens": self.max_new_tokens, "eos_token_id": self.stops}
        options["pad_token_id"] = pad
        if temperature > 0:
            options.update(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
        else:
            options.update(do_sample=False)
        with torch.no_grad():
            rows = self.model.generate(input_ids=ids, attention_mask=attention, **options)[:, width:].tolist()
        texts = []
        for row in rows:
            # The end-of-turn token is not part of the reply; a call's closing marker is (the parser reads it).
            cut = next((i for i, token in enumerate(row) if token in self.stops), len(row) - 1)
            kept = row[: cut + 1] if row[cut] == self.stops[1] else row[:cut]
            texts.append(tokenizer.decode(kept, skip_special_tokens=False).replace(tokenizer.pad_token, ""))
        return texts


def play(
    generator: _Generator, loop: AgentLoop, tasks: Sequence[Task], temperature: float, batch: int = 64
) -> list[tuple[float, bool]]:
    """Each task's episode: (reward, whether its first turn called a tool), turns batched across episodes."""
    results: list[tuple[float, bool]] = []
    for start in range(0, len(tasks), batch):
        chunk = tasks[start : start + batch]
        chats: list[Messages | None] = [loop.opening(task) for task in chunk]
        rewards = [0.0] * len(chunk)
        first_call = [False] * len(chunk)
        for turn in range(loop.max_turns):
            live = [i for i, chat in enumerate(chats) if chat is not None]
            if not live:
                break
            texts = generator.replies([chats[i] for i in live], loop.tools, temperature)  # type: ignore[misc]
            for i, text in zip(live, texts, strict=True):
                reply = parse_reply(text)
                if turn == 0:
                    first_call[i] = bool(reply.get("tool_calls"))
                chats[i], rewards[i] = loop.step(chunk[i], chats[i], reply)  # type: ignore[arg-type]
        results.extend(zip(rewards, first_call, strict=True))
    return results


def measure(
    model_dir: Path | str,
    loop: AgentLoop,
    held_out: Sequence[Task],
    train: Sequence[Task],
    *,
    groups: int = 64,
    group_size: int = 4,
    temperature: float = 1.0,
    max_new_tokens: int = 96,
    seed: int = 0,
    threads: int | None = None,
) -> StartQuality:
    """The figures of StartQuality for the model in model_dir (greedy on held_out; sampled groups of train)."""
    generator = _Generator.load(Path(model_dir), max_new_tokens)
    generator.torch.set_num_threads(threads or threads_for_load(0))
    generator.torch.manual_seed(seed)
    greedy = play(generator, loop, held_out, 0.0)
    sample = random.Random(seed).sample(list(train), min(groups, len(train)))
    sampled = play(generator, loop, [task for task in sample for _ in range(group_size)], temperature)
    group_rewards = [[r for r, _ in sampled[i : i + group_size]] for i in range(0, len(sampled), group_size)]
    mixed = sum(1 for rewards in group_rewards if len(set(rewards)) > 1)
    return StartQuality(
        held_out_accuracy=sum(r for r, _ in greedy) / max(1, len(greedy)),
        held_out_tasks=len(greedy),
        tool_call_rate=sum(c for _, c in greedy) / max(1, len(greedy)) if loop.tools else None,
        mixed_group_share=mixed / max(1, len(group_rewards)),
        sampled_reward=sum(r for r, _ in sampled) / max(1, len(sampled)),
        groups=len(group_rewards),
        group_size=group_size,
        temperature=temperature,
    )


def greedy_accuracy(
    model: Any, tokenizer: Any, loop: AgentLoop, tasks: Sequence[Task], max_new_tokens: int = 96
) -> float:
    """The greedy accuracy of a model in memory on tasks (a warm start's stopping probe)."""
    results = play(_Generator(model, tokenizer, max_new_tokens), loop, tasks, 0.0)
    return sum(r for r, _ in results) / max(1, len(results))


def record(model_dir: Path | str, quality: StartQuality) -> None:
    """Writes the figures into the model's recipe file, beside how it was made."""
    path = Path(model_dir) / RECIPE_FILE
    recipe = json.loads(path.read_text()) if path.exists() else {}
    recipe["start_quality"] = quality.as_dict()
    path.write_text(json.dumps(recipe, indent=2) + "\n")


def recorded(model_dir: Path | str) -> StartQuality | None:
    """The figures a model folder holds, or None (never measured, or by an older recipe)."""
    path = Path(model_dir) / RECIPE_FILE
    if not path.exists():
        return None
    figures = json.loads(path.read_text()).get("start_quality")
    try:
        return StartQuality(**figures) if figures else None
    except TypeError:
        return None
