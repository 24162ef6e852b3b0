"""The long-context tiny model (services/engine/tiny_model.py: 65,536 positions) served by the real CPU engine with a
context past the default model's 512 positions. A prompt of several thousand tokens is answered with the
log-probs transformers computes (positions past 512 are computed alike by the engine and the trainer); a prompt
longer than the engine's context is refused with vLLM's own message, from which `agl train`'s pre-check
(services/cli/train/prompt_fit.py) writes its line, the prompt counted exactly by the engine's /tokenize. The 64k
figures are bench/long_context_bench.py's: this engine's context is 8,192, enough to show positions past 512."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from safetensors.torch import load_file

from services._gen.agl.v1 import event_pb2
from services.cli.train import collect, prompt_fit
from services.engine.tiny_model import LONG_POSITIONS
from tests.support.engine import Engine, build_model, reference_logprobs, run_engine

pytestmark = pytest.mark.timeout(300)
CONTEXT = 8_192
SERVED = 6_000  # characters of system prompt: one token each on the byte-level tokenizer of a model without corpus
REFUSED = 9_000


@pytest.fixture(scope="module")
def long_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model(tmp_path_factory.mktemp("long-model") / "model", positions=LONG_POSITIONS)


@pytest.fixture(scope="module")
def long_engine(long_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    root = tmp_path_factory.mktemp("long-engine")
    with run_engine(long_model, args=["--max-model-len", str(CONTEXT)], log_dir=root) as engine:
        yield engine


def system_prompt_chat(engine: Engine, characters: int) -> dict:
    text = ("You are a coding agent. Read the repository, then answer. " * 400)[:characters]
    return {
        "model": engine.model_name,
        "messages": [{"role": "system", "content": text}, {"role": "user", "content": "go"}],
        "max_tokens": 4,
        "temperature": 0,
        "logprobs": True,
        "return_token_ids": True,
    }


def test_the_long_context_model_has_the_default_weights_and_more_positions(long_model: Path, tmp_path: Path) -> None:
    short, long = build_model(tmp_path / "short"), long_model
    config = json.loads((long / "config.json").read_text())
    assert config["max_position_embeddings"] == LONG_POSITIONS and config["rope_parameters"]["rope_theta"] == 1e6
    assert json.loads((short / "config.json").read_text())["max_position_embeddings"] == 512
    a, b = load_file(str(short / "model.safetensors")), load_file(str(long / "model.safetensors"))
    assert a.keys() == b.keys() and all(a[name].equal(b[name]) for name in a)


def test_a_prompt_of_thousands_of_tokens_is_served_with_the_trainers_logprobs(long_engine: Engine) -> None:
    reply = httpx.post(
        f"{long_engine.openai_url}/chat/completions", json=system_prompt_chat(long_engine, SERVED), timeout=240
    )
    assert reply.status_code == 200, reply.text
    body = reply.json()
    prompt_ids, choice = body["prompt_token_ids"], body["choices"][0]
    assert len(prompt_ids) > SERVED  # every character a token, plus the chat template's
    engine_lps = [entry["logprob"] for entry in choice["logprobs"]["content"]]
    reference = reference_logprobs(long_engine.model_dir, long_engine.model_dir, prompt_ids, choice["token_ids"])
    gap = max(abs(a - b) for a, b in zip(engine_lps, reference, strict=True))
    assert gap < 1e-4, (gap, engine_lps, reference)
    record = {"calls": [{"prompt_token_ids": prompt_ids, "http_status": 200}]}
    assert prompt_fit.first_prompt(record) == prompt_fit.Measured(len(prompt_ids))


def test_a_prompt_over_the_context_is_measured_and_named_in_one_line(long_engine: Engine) -> None:
    request = system_prompt_chat(long_engine, REFUSED)
    reply = httpx.post(f"{long_engine.openai_url}/chat/completions", json=request, timeout=240)
    assert reply.status_code == 400, reply.text
    # What the proxy records for the refused call, read back as agl train reads the smoke rollout's calls.
    event = event_pb2.ModelRequest(request_json=json.dumps(request), response_json=reply.text, http_status=400)
    call = {"prompt_token_ids": [], "http_status": 400, **collect._refusal(event)}
    assert "maximum context length is 8192 tokens" in call["error"] and call["request"] == request
    assert prompt_fit.first_prompt({"calls": [call]}) == prompt_fit.Measured(CONTEXT + 1, at_least=True)
    measured = asyncio.run(prompt_fit.measure_first_prompt({"calls": [call]}, long_engine.openai_url))
    assert measured is not None and not measured.at_least and measured.tokens > REFUSED
    limits = prompt_fit.Limits(CONTEXT - 256, 256, CONTEXT, LONG_POSITIONS, tiny=True)
    assert prompt_fit.problem(measured, limits) == (
        f"the agent's first prompt is {measured.tokens:,} tokens, over --max-prompt-length 7936: raise it to at "
        f"least {measured.tokens} (the tiny model holds up to 65,536 tokens of prompt and response)"
    )
