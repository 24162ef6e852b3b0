"""v1.0's gsm8k `CompletionAgent`, unchanged, through AGL's controller and proxy against the real CPU vLLM engine.

The agent sends its prompt to `/v1/completions` as token ids (its model's tokenizer, `GSM8K_MODEL`) and decodes the
choice's `token_ids` with the same tokenizer. The stand-in engine cannot serve that: its toy tokenizer's ids are not
a Hugging Face tokenizer's (tried: it reads the tiny model's ids for "What is 6 * 7?" as unknown pieces,
`<54><71>...`, and its answer's ids, 1000 and up, decode to "" with that tokenizer). The tiny model the CPU engine
serves has a real tokenizer, which the agent loads from its folder (there is no hub here). v1.0's trainer's rollout
manager enqueues the rollouts, AGL's controller runs the agent, and what the trainer reads back (`format=triplet`)
is checked against the tokenizer and the agent's own scoring.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from tests.proxy.conftest import run_proxy
from tests.support.engine import Engine, build_model, run_engine
from tests.support.procs import start_ledger

from .conftest import KEY, Agl1, Stack, agl_controller, run_json

QUESTIONS = ["What is 6 * 7?", "What is 10 - 3?"]
ANSWERS = ["42", "7"]


# The agent asks for max_tokens=1024 and vLLM refuses a max_tokens above the context length (400), so this engine
# serves the tiny model with a context of 2048 (the session's cpu_engine has 512). The tiny model's positions are
# rotary, with no weights of their own: only its config's limit changes.
CONTEXT = 2048


def long_context_model(directory: Path) -> Path:
    model_dir = build_model(directory)
    config_path = model_dir / "config.json"
    config = json.loads(config_path.read_text())
    config["max_position_embeddings"] = CONTEXT
    config_path.write_text(json.dumps(config, indent=2))
    return model_dir


@pytest.fixture(scope="module")
def engine_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The real CPU engine, the ledger and a proxy whose model is the one the engine serves (the proxy sets every
    call's model)."""
    root = tmp_path_factory.mktemp("completion-engine")
    model_dir = long_context_model(root / "model")
    engine_args = ["--max-model-len", str(CONTEXT)]
    with (
        run_engine(model_dir, args=engine_args, log_dir=root) as engine,
        start_ledger(key=KEY) as ledger,
        run_proxy(ledger.address, args=["--model-name", engine.model_name]) as proxy,
    ):
        # The first request compiles the sampler (~20 s on 2 cores), longer than the rollouts should wait.
        warm = {"model": engine.model_name, "prompt": [1, 2, 3], "max_tokens": 4}
        httpx.post(f"{engine.openai_url}/completions", json=warm, timeout=180).raise_for_status()
        yield Stack(ledger, engine, proxy)


def gsm8k_example(agl1: Agl1) -> ModuleType:
    """v1.0's gsm8k_agent module itself, for its prompt and its scoring (the test recomputes what the agent did)."""
    spec = importlib.util.spec_from_file_location("v1_gsm8k_agent", agl1.examples / "gsm8k" / "gsm8k_agent.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_v1_completion_agent_runs_unmodified_through_agl(agl1: Agl1, engine_stack: Stack, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    engine = engine_stack.engine
    assert isinstance(engine, Engine)
    model_dir = str(engine.model_dir)
    spec: dict[str, Any] = {
        "base_url": engine_stack.proxy.url,
        "key": KEY,
        "model": engine.model_name,
        "engine": engine_stack.engine_address,
        "agent_class": "gsm8k_agent.CompletionAgent",
        # v1.0's env_map takes paths into the input: the tokenizer's folder travels in each sample.
        "env_map": {"QUESTION": "input.question", "ANSWER": "input.answer", "GSM8K_MODEL": "input.model"},
        "data": {"question": QUESTIONS, "answer": ANSWERS, "model": [model_dir] * len(QUESTIONS)},
        "n": 2,
        "timeout_s": 180,
    }
    with agl_controller(agl1, engine_stack, tmp_path, ["gsm8k"]) as controller:
        answer = run_json(agl1, tmp_path, "trainer_step.py", spec, timeout_s=300)
        assert controller.alive(), controller.log_text()[-4000:]

    example = gsm8k_example(agl1)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    vocab_size = json.loads((engine.model_dir / "config.json").read_text())["vocab_size"]
    expected_prompt = {q: tokenizer.encode(example.build_prompt(q), add_special_tokens=False) for q in QUESTIONS}
    completed, followed = answer["completed"], answer["followed"]
    assert len(completed) == 4 and len(followed) == 2, answer["output"][-4000:]
    for rollout in completed + followed:
        assert rollout["state"] == "succeeded", (rollout, controller.log_text()[-4000:])
        # One call, captured once, then the agent's reward: nothing else was filed.
        assert rollout["event_types"] == ["model_request", "reward"], rollout
        (triplet,) = rollout["triplets"]
        # The prompt the agent encoded reached the engine as those very ids, and the triplet holds them.
        assert triplet["prompt_ids"] == expected_prompt[rollout["input"]["question"]]
        # Sampled from the model's vocabulary (its embedding rows: the tokenizer's ids padded to a multiple of 64).
        assert triplet["response_ids"] and all(0 <= t < vocab_size for t in triplet["response_ids"])
        assert triplet["server"]["model"] == engine.model_name
        # The reward stored is the agent's own score of the ids it decoded (the ones the triplet holds).
        text = tokenizer.decode(triplet["response_ids"], skip_special_tokens=True)
        score = 1.0 if example.normalize_answer(text) == example.normalize_answer(rollout["input"]["answer"]) else 0.0
        assert rollout["final_reward"] == triplet["reward"] == score
    # Train calls carry the engine's log-prob of every sampled token; validation calls ask for none.
    for rollout in completed:
        (triplet,) = rollout["triplets"]
        assert len(triplet["log_probs"]) == len(triplet["response_ids"])
        assert all(value <= 0.0 for value in triplet["log_probs"])
    assert all(r["triplets"][0]["log_probs"] is None for r in followed)
    assert answer["after_delete"] == [404] * 6 and answer["deleted_models"] == {"status": "ok"}
