"""The stand-in's --mistake-rate: sampled answers may be wrong (so demo groups see varied rewards), greedy never."""

from __future__ import annotations

import pytest

from services.standin.config import parse_config
from services.standin.engine import generate_chat, generate_completion
from services.standin.tokenizer import ToyTokenizer

QUESTION = [{"role": "user", "content": "What is 6 * 7?"}]


def _chat_text(temperature: float, rate: float, seed: int | None = None) -> str:
    body = {"model": "m", "messages": QUESTION, "temperature": temperature}
    if seed is not None:
        body["seed"] = seed
    return generate_chat(body, "m", ToyTokenizer(), rate).choices[0].text


def test_greedy_answers_stay_right_whatever_the_rate() -> None:
    assert _chat_text(0.0, 1.0) == "The answer is 42."


def test_sampled_answers_err_at_rate_one_and_never_at_rate_zero() -> None:
    assert _chat_text(1.0, 1.0) == "The answer is 43."
    assert _chat_text(1.0, 0.0) == "The answer is 42."
    completion = generate_completion({"model": "m", "prompt": "Q: What is 2 + 2?\nA:"}, "m", ToyTokenizer(), 1.0)
    assert completion.choices[0].text == " The answer is 5."


def test_a_seed_makes_the_choice_reproducible() -> None:
    outcomes = {_chat_text(1.0, 0.5, seed=7) for _ in range(5)}
    assert len(outcomes) == 1
    both = {_chat_text(1.0, 0.5, seed=s) for s in range(40)}
    assert both == {"The answer is 42.", "The answer is 43."}


@pytest.mark.parametrize("rate", ["-0.1", "1.5"])
def test_rate_outside_zero_one_is_refused(rate: str) -> None:
    with pytest.raises(SystemExit):
        parse_config(["--mistake-rate", rate], env={})
