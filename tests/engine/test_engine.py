"""The real CPU vLLM engine (one per session, `cpu_engine`): what it answers and what its admin routes do."""

from __future__ import annotations

import math

import pytest

from services.engine.control import EngineControl, EngineError, lacks_method
from services.engine.launch import WORKER_EXTENSION
from tests.support.engine import Engine, chat


def test_chat_returns_token_ids_and_logprobs(cpu_engine: Engine) -> None:
    answer = chat(cpu_engine, "What is 2 + 3?", max_tokens=12, temperature=1.0, seed=5)
    assert answer["model"] == "agl-policy"
    prompt_ids = answer["prompt_token_ids"]
    (choice,) = answer["choices"]
    response_ids = choice["token_ids"]
    logprobs = [entry["logprob"] for entry in choice["logprobs"]["content"]]
    # The byte-level tokenizer: the prompt holds the question's bytes between the chat template's special tokens.
    assert len(prompt_ids) > len("What is 2 + 3?") and all(isinstance(t, int) for t in prompt_ids)
    assert 1 <= len(response_ids) <= 12 and len(logprobs) == len(response_ids)
    assert all(lp <= 0.0 and math.isfinite(lp) for lp in logprobs)
    assert answer["usage"]["completion_tokens"] == len(response_ids)


def test_served_model_name_and_worker_extension(cpu_engine: Engine) -> None:
    import httpx

    models = httpx.get(f"{cpu_engine.openai_url}/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == ["agl-policy"]
    log = cpu_engine.log_text()
    assert f"Injected <class '{WORKER_EXTENSION}'>" in log


async def test_every_linear_weight_is_plain_so_reloads_reach_it(cpu_engine: Engine) -> None:
    async with EngineControl(cpu_engine.openai_url) as control:  # the registry's form, `.../v1`, works too
        (layout,) = await control.collective_rpc("agl_weight_layout")
    assert layout["dispatch_patched"] is True
    assert layout["packed_layers"] == 0
    # 4 layers x (qkv, o, gate_up, down) + the embedding that is also the tied lm_head (+ its logits head)
    assert layout["plain_layers"] >= 17
    assert layout["vllm_version"] == "0.32.0"


async def test_health_weight_version_and_prefix_cache(cpu_engine: Engine) -> None:
    async with EngineControl(cpu_engine.url) as control:
        assert await control.health()
        await control.wait_ready(timeout_s=5)
        await control.set_weight_version(42)
        assert await control.weight_version() == "42"
        await control.set_weight_version("step-3")
        assert await control.weight_version() == "step-3"
        await control.reset_prefix_cache()


async def test_pause_then_resume(cpu_engine: Engine) -> None:
    async with EngineControl(cpu_engine.url) as control:
        await control.pause("wait")
        try:
            assert await control.is_paused()
        finally:
            await control.resume()
        assert not await control.is_paused()
    chat(cpu_engine, "still serving?", max_tokens=2)


async def test_a_refused_admin_call_names_engine_route_status_and_message(cpu_engine: Engine) -> None:
    async with EngineControl(cpu_engine.url) as control:
        with pytest.raises(EngineError) as caught:
            await control.collective_rpc("no_such_worker_method")
    err = caught.value
    assert err.url == cpu_engine.url and err.status == 500
    assert err.route == "POST /collective_rpc (no_such_worker_method)"
    # The one-process executor's words (vLLM's multiprocess executor says "has no attribute"; control.py reads both).
    assert "Method 'no_such_worker_method' is not implemented" in err.message
    # What reload_weights reads to fall back to vLLM's own reload on an engine without AGL's extension, either way.
    assert lacks_method(err.message, "no_such_worker_method") and not lacks_method(err.message, "reload_weights")
    assert lacks_method("AttributeError: 'Worker' object has no attribute 'agl_x'", "agl_x")
    assert str(err).startswith(f"engine {cpu_engine.url}: POST /collective_rpc (no_such_worker_method) -> HTTP 500: ")


async def test_an_unreachable_engine_is_an_error_not_a_hang() -> None:
    from tests.support.procs import free_port

    url = f"http://127.0.0.1:{free_port()}"
    async with EngineControl(url, timeout_s=2) as control:
        assert not await control.health()
        with pytest.raises(EngineError, match=r"POST /reset_prefix_cache -> no answer: ConnectError"):
            await control.reset_prefix_cache()
        with pytest.raises(EngineError, match=r"GET /health -> no answer: not ready after 0.3s"):
            await control.wait_ready(timeout_s=0.3, interval_s=0.1)
