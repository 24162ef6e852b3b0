"""agl train's pre-check of the agent's first prompt (services/cli/train/prompt_fit.py): the prompt's size read from
what the engine said, the one line naming the setting to change, the tiny model's size chosen by the row limits.
The real engine's refusal and /tokenize count are tests/engine/test_long_context.py's; agl train's smoke line is
tests/cli/test_train.py's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.cli.errors import CliError
from services.cli.train import options, prompt_fit
from services.cli.train.prompt_fit import Limits, Measured

TINY = Limits(256, 256, 512, 65_536, tiny=True)
# vLLM 0.32's refusals (vllm/renderers/params.py), as the proxy records them.
CUT = (
    "This model's maximum context length is 512 tokens. However, your prompt contains at least 513 input tokens, "
    "which exceeds this limit even without any output tokens. Please reduce the length of the input prompt."
)
EXACT = CUT.replace("at least 513", "18432")
CHARS = (
    "This model's maximum context length is 512 tokens. However, your prompt contains 90000 characters (more than "
    "5120 characters, which is the upper bound for 512 input tokens). Please reduce the length of the input prompt."
)


def test_the_prompt_size_is_read_from_the_engines_answer_or_refusal() -> None:
    assert prompt_fit.first_prompt({"calls": [{"prompt_token_ids": [1, 2, 3]}, {"prompt_token_ids": [1]}]}) == (
        Measured(3)
    )
    assert prompt_fit.first_prompt({"calls": [{"prompt_token_ids": [], "error": CUT}]}) == Measured(513, True)
    assert prompt_fit.first_prompt({"calls": [{"prompt_token_ids": [], "error": EXACT}]}) == Measured(18432)
    assert prompt_fit.first_prompt({"calls": [{"prompt_token_ids": [], "error": CHARS}]}) == Measured(513, True)
    other = {"prompt_token_ids": [], "error": "The model `x` does not exist."}
    assert prompt_fit.first_prompt({"calls": [other]}) is None
    assert prompt_fit.first_prompt({"calls": []}) is None


def test_a_prompt_that_does_not_fit_is_one_line_naming_the_setting() -> None:
    assert prompt_fit.problem(Measured(18432), TINY) == (
        "the agent's first prompt is 18,432 tokens, over --max-prompt-length 256: raise it to at least 18432 "
        "(the tiny model holds up to 65,536 tokens of prompt and response)"
    )
    assert prompt_fit.problem(Measured(513, at_least=True), TINY) == (
        "the agent's first prompt is at least 513 tokens, over --max-prompt-length 256: raise it to at least 513 "
        "(the tiny model holds up to 65,536 tokens of prompt and response)"
    )
    assert prompt_fit.problem(Measured(70_000), TINY) == (
        "the agent's first prompt is 70,000 tokens, more than the tiny model's 65,536 positions hold: shorten the "
        "agent's prompt or train a model with a longer context (--model DIR)"
    )
    real = Limits(2048, 1024, 2048, 2048, tiny=False)  # a model of 2,048 positions: the engine's context is capped
    assert prompt_fit.problem(Measured(2048), real) == (
        "the agent's first prompt is 2,048 tokens, more than the model's 2,048 positions hold: shorten the agent's "
        "prompt"
    )
    unknown = Limits(2048, 1024, 3072, None, tiny=False)
    assert prompt_fit.problem(Measured(3000), unknown) == (
        "the agent's first prompt is 3,000 tokens, over --max-prompt-length 2048: raise it to at least 3000"
    )
    assert prompt_fit.problem(Measured(256), TINY) is None and prompt_fit.problem(Measured(2047), real) is None


def test_the_tiny_model_is_sized_by_the_rows_and_longer_rows_are_refused() -> None:
    assert options.lengths("tiny", None, None) == (256, 256)
    assert prompt_fit.tiny_positions(256, 256) == 512
    assert prompt_fit.tiny_positions(300, 256) == 65_536 and prompt_fit.tiny_positions(65_280, 256) == 65_536
    with pytest.raises(CliError) as refused:
        options.lengths("tiny", 65_536, None)
    assert str(refused.value) == (
        "--max-prompt-length 65536 + --max-response-length 256 = 65,792 tokens: more than the tiny model's 65,536 "
        "positions hold (lower them, or --model DIR with a longer context)"
    )
    assert options.lengths("/some/model", 65_536, None) == (65_536, 1024)  # a real model's own positions decide


def test_a_runs_limits_come_from_its_options_and_its_model(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 2048}))
    assert prompt_fit.run_limits(False, tmp_path, 2048, 1024) == Limits(2048, 1024, 2048, 2048, tiny=False)
    assert prompt_fit.run_limits(True, tmp_path, 300, 256) == Limits(300, 256, 556, 65_536, tiny=True)
    (tmp_path / "config.json").write_text("{}")
    assert prompt_fit.run_limits(False, tmp_path, 2048, 1024) == Limits(2048, 1024, 3072, None, tiny=False)


def test_the_trainer_budget_holds_the_longest_row() -> None:
    assert prompt_fit.trainer_overrides(256, 256) == []
    assert prompt_fit.trainer_overrides(16_000, 384) == []
    assert prompt_fit.trainer_overrides(20_064, 256) == ["actor_rollout_ref.actor.ppo_max_token_len_per_gpu=20320"]


def test_a_resumed_run_keeps_its_tiny_model(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 512}))
    prompt_fit.check_resumed_tiny_model(tmp_path, 512)
    with pytest.raises(CliError, match=r"has 512 positions, too few .* start a new run \(another --run-id\)"):
        prompt_fit.check_resumed_tiny_model(tmp_path, 65_536)


def test_the_tokenize_request_is_the_calls_prompt() -> None:
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}
    assert prompt_fit.tokenize_body({**chat, "max_tokens": 5}) == {**chat, "add_generation_prompt": True}
    assert prompt_fit.tokenize_body({"model": "m", "prompt": "text"}) == {"model": "m", "prompt": "text"}
    assert prompt_fit.tokenize_body({"model": "m", "prompt": [1, 2]}) is None
