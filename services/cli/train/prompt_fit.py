"""The agent's first prompt against the run's limits, measured on the smoke rollout before anything trains.

A real harness's first prompt (system prompt and tools) is 13-19k tokens with its own tokenizer and 20-40k with the
tiny model's. A row whose prompt is over --max-prompt-length is dropped by the trainer, and a prompt over the
engine's context is refused by the engine (a 400), so a run whose first prompt does not fit would train on nothing.
Guarantee: when the smoke rollout's first call does not fit, `agl train` stops before the trainer starts with one
line giving the prompt's size and the setting to change. The size is the engine's own count: the prompt tokens of a
call it answered, or, for a call it refused, its /tokenize count of the same request (vLLM's message gives only
"at least N" for a prompt it cut while reading it).

The tiny model comes in two sizes (services/engine/tiny_model.py): 512 positions where the rows fit (the default
256 + 256), else the long-context variant with 65,536; rows longer than that are refused before anything starts.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from services.engine.tiny_model import LONG_POSITIONS, POSITIONS

from ..errors import USAGE, CliError
from .checks import engine_context

# The actor's token budget per micro-batch in the CPU placement (actor_rollout_ref.actor.ppo_max_token_len_per_gpu
# with use_dynamic_bsz, hydra-conf/placement/cpu.yaml; verl's default too; the log-prob budgets follow it): verl
# refuses a row longer than it ("max_token_len must be greater than the sequence length"), so a run with longer rows
# raises it to the rows' length.
TRAINER_TOKEN_BUDGET = 16_384
# vLLM's refusal of a prompt longer than its context (vllm/renderers/params.py, 0.32): "... your prompt contains
# [at least ]N input tokens ..."; the stand-in engine says the same.
_REFUSED = re.compile(r"maximum context length is (\d+) tokens\. However, your prompt contains (at least )?(\d+) input")
_REFUSED_CHARS = re.compile(r"maximum context length is (\d+) tokens\. However, your prompt contains (\d+) characters")
TOKENIZE_TIMEOUT_S = 60.0


def tiny_positions(prompt_length: int, response_length: int) -> int:
    """The tiny model's positions for rows of these limits: 512 where they fit (the demo's model), else 65,536."""
    wanted = prompt_length + response_length
    if wanted > LONG_POSITIONS:
        raise CliError(
            f"--max-prompt-length {prompt_length} + --max-response-length {response_length} = {wanted:,} tokens: more "
            f"than the tiny model's {LONG_POSITIONS:,} positions hold (lower them, or --model DIR with a longer "
            "context)",
            USAGE,
        )
    return POSITIONS if wanted <= POSITIONS else LONG_POSITIONS


def model_positions(model_dir: Path) -> int | None:
    """max_position_embeddings of a model directory's config.json (None when it does not say)."""
    try:
        value = json.loads((Path(model_dir) / "config.json").read_text()).get("max_position_embeddings")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def check_resumed_tiny_model(path: Path, positions: int) -> None:
    """A resumed run keeps the tiny model it started with (its weights were trained from it): rows longer than its
    positions are refused, since the long-context variant's rotary base differs."""
    made = model_positions(path) or POSITIONS
    if made < positions:
        raise CliError(
            f"--resume: this run's tiny model ({path}) has {made:,} positions, too few for --max-prompt-length and "
            f"--max-response-length as given; start a new run (another --run-id) to get the {positions:,}-position "
            "one",
            USAGE,
        )


def trainer_overrides(prompt_length: int, response_length: int) -> list[str]:
    """The trainer's token budget raised to hold one row of the longest kind (nothing when verl's default does)."""
    row = prompt_length + response_length
    return [] if row <= TRAINER_TOKEN_BUDGET else [f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={row}"]


@dataclass(frozen=True)
class Limits:
    """What a prompt must fit: the row limit, the engine's context, and the most the model could be given."""

    max_prompt_length: int
    max_response_length: int
    engine_context: int  # the engine's max_model_len
    model_holds: int | None  # the tiny model's longest variant, or the model's max_position_embeddings (if known)
    tiny: bool


def run_limits(tiny: bool, model_dir: Path, prompt_length: int, response_length: int) -> Limits:
    """A run's limits: the engine's context is the rows' length within the model's positions (engine_context)."""
    holds = LONG_POSITIONS if tiny else model_positions(model_dir)
    context = engine_context(model_dir, prompt_length + response_length)
    return Limits(prompt_length, response_length, context, holds, tiny)


@dataclass(frozen=True)
class Measured:
    tokens: int
    at_least: bool = False  # the engine stopped counting (a prompt it refused, no exact count to be had)

    def __str__(self) -> str:
        return f"{'at least ' if self.at_least else ''}{self.tokens:,} tokens"


def refused_prompt(message: str) -> Measured | None:
    """The prompt's size in the engine's refusal of a prompt longer than its context (None for another message)."""
    found = _REFUSED.search(message)
    if found:
        return Measured(int(found.group(3)), at_least=bool(found.group(2)))
    found = _REFUSED_CHARS.search(message)
    if found:  # refused before tokenizing (more characters than the context's tokens could hold)
        return Measured(int(found.group(1)) + 1, at_least=True)
    return None


def first_prompt(record: Mapping[str, Any]) -> Measured | None:
    """The size of the rollout's first prompt as the engine counted it (None: no call, or a refusal of another
    kind)."""
    calls = record.get("calls") or []
    if not calls:
        return None
    first = calls[0]
    if first.get("prompt_token_ids"):
        return Measured(len(first["prompt_token_ids"]))
    return refused_prompt(str(first.get("error") or ""))


def problem(measured: Measured, limits: Limits) -> str | None:
    """The one line for a first prompt that does not fit the limits (None when it does)."""
    tokens = measured.tokens
    what = f"the agent's first prompt is {measured}"
    holds = limits.model_holds
    if holds is not None and tokens >= holds:
        model = "tiny model's" if limits.tiny else "model's"
        other = " or train a model with a longer context (--model DIR)" if limits.tiny else ""
        return f"{what}, more than the {model} {holds:,} positions hold: shorten the agent's prompt{other}"
    if tokens > limits.max_prompt_length or tokens >= limits.engine_context:
        model = "the tiny model holds" if limits.tiny else "the model holds"
        room = f" ({model} up to {holds:,} tokens of prompt and response)" if holds is not None else ""
        return f"{what}, over --max-prompt-length {limits.max_prompt_length}: raise it to at least {tokens}{room}"
    return None


def tokenize_body(request: Mapping[str, Any]) -> dict[str, Any] | None:
    """vLLM's /tokenize body for the prompt of a chat or completions request as the proxy sent it upstream."""
    model = request.get("model")
    if isinstance(request.get("messages"), list):
        body = {"model": model, "messages": request["messages"], "add_generation_prompt": True}
        for name in ("tools", "chat_template_kwargs"):
            if request.get(name):
                body[name] = request[name]
        return body
    if isinstance(request.get("prompt"), str):
        return {"model": model, "prompt": request["prompt"]}
    return None


async def count_prompt(engine_url: str, request: Mapping[str, Any]) -> int | None:
    """The engine's count of a request's prompt (its /tokenize, which has no length limit); None when it cannot
    say."""
    body = tokenize_body(request)
    if body is None:
        return None
    url = engine_url.rstrip("/").removesuffix("/v1") + "/tokenize"
    try:
        async with httpx.AsyncClient(timeout=TOKENIZE_TIMEOUT_S) as client:
            reply = await client.post(url, json=body)
        count = reply.json().get("count") if reply.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return count if isinstance(count, int) and count > 0 else None


async def measure_first_prompt(record: Mapping[str, Any], engine_url: str) -> Measured | None:
    """first_prompt, made exact for a refused prompt by the engine's count of it."""
    measured = first_prompt(record)
    if measured is None or not measured.at_least or not engine_url:
        return measured
    request = record["calls"][0].get("request")
    exact = await count_prompt(engine_url, request) if isinstance(request, Mapping) else None
    return Measured(exact) if exact is not None and exact >= measured.tokens else measured
