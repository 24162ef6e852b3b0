"""The agents `make demo` trains, each with its tasks, its warm start and the trainer settings it needs.

- `math` (the default): the single-turn math agent (examples/math_agent) on additions of two numbers in 0..N.
- `calc`: the unmodified multi-turn calc agent (examples/calc_agent: OpenAI function calling, a `calculator`
  tool) on products of two 2-digit numbers, which the tiny model cannot compute but can get from the tool.
  The warm start mixes transcripts with and without a tool call; rows are whole trajectories (every turn of a
  rollout in one row, tool results masked).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

Task = dict[str, Any]
Example = tuple[list[dict[str, Any]], str]


@dataclass(frozen=True)
class DemoAgent:
    name: str
    agent_class: str
    # Generated tasks: (train, held-out), disjoint.
    make_tasks: Callable[[argparse.Namespace], tuple[list[Task], list[Task]]]
    corpus: Callable[[Sequence[Task]], list[str]]
    warm_examples: Callable[[Sequence[Task]], list[Example]]
    # The tools the agent offers (rendered into the warm start's prompts as the engine renders them), or None.
    tools: Callable[[], list[dict[str, Any]] | None]
    # The trainer's row limits and aggregation for this agent's rollouts.
    max_prompt_length: int
    response_length: int
    aggregation: str
    # Seconds a rollout may take.
    timeout_s: int
    # The supervised warm start: steps and learning rate.
    warm_steps: int
    warm_lr: float
    train_tasks: int


def _math_tasks(args: argparse.Namespace) -> tuple[list[Task], list[Task]]:
    from examples.math_agent.tasks import split_tasks

    return split_tasks(args.train_tasks, args.val_tasks, seed=7, max_operand=args.max_operand)


def _math_corpus(train: Sequence[Task]) -> list[str]:
    from examples.math_agent.tasks import tokenizer_corpus

    return tokenizer_corpus(train)


def _math_examples(train: Sequence[Task]) -> list[Example]:
    from examples.math_agent.tasks import messages

    return [(messages(t), t["answer"]) for t in train]


def _calc_tasks(args: argparse.Namespace) -> tuple[list[Task], list[Task]]:
    from examples.calc_agent.tasks import split_tasks

    return split_tasks(args.train_tasks, args.val_tasks, seed=7)


def _calc_corpus(train: Sequence[Task]) -> list[str]:
    from examples.calc_agent.tasks import tokenizer_corpus

    return tokenizer_corpus(train)


def _calc_examples(train: Sequence[Task]) -> list[Example]:
    from examples.calc_agent.tasks import warm_start_examples

    return warm_start_examples(train, tool_share=CALC_TOOL_SHARE, seed=3)


def _calc_tools() -> list[dict[str, Any]]:
    from examples.calc_agent.tasks import TOOLS

    return list(TOOLS)


# The share of warm-start tasks solved with the tool: the starting policy calls it about this often.
CALC_TOOL_SHARE = 0.3

AGENTS = {
    "math": DemoAgent(
        name="math",
        agent_class="examples.math_agent.agent:MathAgent",
        make_tasks=_math_tasks,
        corpus=_math_corpus,
        warm_examples=_math_examples,
        tools=lambda: None,
        max_prompt_length=64,
        response_length=16,
        aggregation="trajectory",
        timeout_s=60,
        warm_steps=150,
        warm_lr=1e-3,
        train_tasks=336,
    ),
    "calc": DemoAgent(
        name="calc",
        agent_class="examples.calc_agent.agent:CalcAgent",
        make_tasks=_calc_tasks,
        corpus=_calc_corpus,
        warm_examples=_calc_examples,
        tools=_calc_tools,
        # A segment row (a call that does not continue its rollout's row) has the whole history as its prompt.
        max_prompt_length=128,
        response_length=96,
        aggregation="trajectory",
        timeout_s=120,
        # Copying four digits into a call and the result out of it takes the tiny model longer to pick up.
        warm_steps=400,
        warm_lr=2e-3,
        train_tasks=2000,
    ),
}
