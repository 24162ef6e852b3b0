"""Weights pushed into the running engine are the weights it serves: after a reload its log-probs move, and
equal Hugging Face transformers' on the same weights; a reload the engine refuses is an error carrying the
engine's message, and the engine keeps serving the weights it had."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from services.engine.control import EngineControl, EngineError
from tests.support.engine import Engine, build_model, chat, reference_logprobs, write_perturbed_weights

PROMPT = "What is 17 + 25?"
TOLERANCE = 1e-4


def sample(engine: Engine) -> tuple[list[int], list[int], list[float]]:
    answer = chat(engine, PROMPT, max_tokens=24, temperature=1.0, seed=7)
    (choice,) = answer["choices"]
    return answer["prompt_token_ids"], choice["token_ids"], [e["logprob"] for e in choice["logprobs"]["content"]]


def scored(engine: Engine, prompt_ids: list[int], response_ids: list[int]) -> list[float]:
    """The engine's log-probs of a fixed response: the same tokens forced, read from `prompt_logprobs`."""
    import httpx

    body = {
        "model": engine.model_name,
        "prompt": [*prompt_ids, *response_ids],
        "max_tokens": 1,
        "prompt_logprobs": 0,
        "temperature": 0.0,
    }
    answer = httpx.post(f"{engine.openai_url}/completions", json=body, timeout=60).json()
    entries = answer["choices"][0]["prompt_logprobs"][len(prompt_ids) :]
    return [entry[str(token)]["logprob"] for entry, token in zip(entries, response_ids, strict=True)]


@pytest.fixture
def base_restored(cpu_engine: Engine) -> Iterator[Engine]:
    """The shared engine, given its starting weights back after the test whatever happened."""
    try:
        yield cpu_engine
    finally:
        cpu_engine.restore_base_weights()


def max_diff(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b)
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


async def test_reload_changes_logprobs_to_those_of_the_new_weights(base_restored: Engine, tmp_path: Path) -> None:
    engine = base_restored
    prompt_ids, response_ids, before = sample(engine)
    base = reference_logprobs(engine.model_dir, engine.model_dir, prompt_ids, response_ids)
    assert max_diff(before, base) < TOLERANCE

    weights = write_perturbed_weights(engine.model_dir, tmp_path / "step-1")  # no lm_head.weight: it is tied
    async with EngineControl(engine.url) as control:
        reload = await control.reload_weights(str(weights))
        await control.reset_prefix_cache()
    assert reload.method == "agl_reload_weights" and reload.seconds > 0

    after = scored(engine, prompt_ids, response_ids)
    assert max_diff(after, before) > 0.01  # the new weights are the ones computing
    expected = reference_logprobs(engine.model_dir, weights, prompt_ids, response_ids)
    assert max_diff(after, expected) < TOLERANCE

    # What it samples now is scored by the new weights too.
    prompt_ids, response_ids, sampled = sample(engine)
    assert max_diff(sampled, reference_logprobs(engine.model_dir, weights, prompt_ids, response_ids)) < TOLERANCE


async def test_reloading_the_base_weights_gives_the_base_logprobs_back(base_restored: Engine, tmp_path: Path) -> None:
    engine = base_restored
    prompt_ids, response_ids, before = sample(engine)
    async with EngineControl(engine.url) as control:
        await control.reload_weights(str(write_perturbed_weights(engine.model_dir, tmp_path / "w", seed=2)))
        await control.reload_weights(str(engine.model_dir))
        await control.reset_prefix_cache()
    assert max_diff(scored(engine, prompt_ids, response_ids), before) < TOLERANCE


async def test_a_missing_weights_dir_is_refused_with_the_engines_message(base_restored: Engine) -> None:
    engine = base_restored
    prompt_ids, response_ids, before = sample(engine)
    async with EngineControl(engine.url) as control:
        with pytest.raises(EngineError) as caught:
            await control.reload_weights("/no/such/weights")
    err = caught.value
    assert err.status == 500 and err.url == engine.url
    assert "weights_dir=/no/such/weights" in err.route
    assert "weights dir /no/such/weights does not exist on the engine's host" in err.message
    assert max_diff(scored(engine, prompt_ids, response_ids), before) < TOLERANCE  # still serving, same weights


async def test_a_damaged_file_is_refused_before_anything_is_loaded(base_restored: Engine, tmp_path: Path) -> None:
    engine = base_restored
    prompt_ids, response_ids, before = sample(engine)
    (tmp_path / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header}")
    async with EngineControl(engine.url) as control:
        with pytest.raises(EngineError, match="is not a readable safetensors file"):
            await control.reload_weights(str(tmp_path))
    assert max_diff(scored(engine, prompt_ids, response_ids), before) < TOLERANCE


async def test_another_models_weights_fail_and_the_old_weights_keep_serving(
    base_restored: Engine, tmp_path: Path
) -> None:
    # vLLM's own reload leaves the worker half-loaded when this fails, and the engine dies on the next request;
    # the worker extension rolls it back.
    engine = base_restored
    prompt_ids, response_ids, before = sample(engine)
    other = build_model(tmp_path / "other", hidden=64)
    async with EngineControl(engine.url) as control:
        with pytest.raises(EngineError, match="failed, the engine still serves the weights from") as caught:
            await control.reload_weights(str(other))
        assert caught.value.status == 500
        assert await control.health()
    assert max_diff(scored(engine, prompt_ids, response_ids), before) < TOLERANCE


async def test_push_weights_reloads_resets_and_labels(base_restored: Engine, tmp_path: Path) -> None:
    engine = base_restored
    prompt_ids, response_ids, before = sample(engine)
    weights = write_perturbed_weights(engine.model_dir, tmp_path / "v5", seed=5)
    async with EngineControl(engine.url) as control:
        reload = await control.push_weights(weights, version=5)
        assert reload.weights_dir == str(weights)
        assert await control.weight_version() == "5"
        with pytest.raises(EngineError, match="does not exist on the engine's host"):
            await control.push_weights(tmp_path / "missing", version=6)
        assert await control.weight_version() == "5"  # a refused push labels nothing
    after = scored(engine, prompt_ids, response_ids)
    assert max_diff(after, reference_logprobs(engine.model_dir, weights, prompt_ids, response_ids)) < TOLERANCE
    assert max_diff(after, before) > 0.01
