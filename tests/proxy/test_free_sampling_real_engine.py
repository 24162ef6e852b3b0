"""A train call with `strict` tools and `tool_choice: "required"` through the proxy in front of the real CPU vLLM
engine (vLLM 0.32, the tiny model): the engine samples unconstrained, so the log-probs recorded with the call are
the policy's own: the same model scoring the sampled tokens again (prompt log-probs of prompt + answer, as the
trainer recomputes them) gives the same numbers. Checked to fail with the constraints passed to the engine: the
forced tokens were recorded at log-prob 0.0, scored again at about -5.5 (largest gap 6.35)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import httpx
import pytest

from services._gen.agl.v1 import model_pb2, rollout_pb2
from services.client import LedgerClient
from tests.support.engine import Engine
from tests.support.procs import (
    ServiceProcess,
    start_ledger,
    start_proxy_for_engine,
)

KEY = "free-sampling-engine-key"
TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluates an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}


@pytest.fixture(scope="module")
def ledger() -> Iterator[ServiceProcess]:
    with start_ledger(key=KEY) as process:
        yield process


@pytest.fixture(scope="module")
def proxy_url(ledger: ServiceProcess, cpu_engine: Engine) -> Iterator[str]:
    with start_proxy_for_engine(ledger.address, cpu_engine.model_name, KEY, ["--train-temperature", "1.0"]) as url:
        yield url


def rescored(engine: Engine, prompt: list[int], answer: list[int]) -> list[float]:
    """The engine's log-probs of `answer` after `prompt`, scored in one pass over both (prompt log-probs)."""
    body = {"model": engine.model_name, "prompt": prompt + answer, "max_tokens": 1, "prompt_logprobs": 0}
    response = httpx.post(f"{engine.openai_url}/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    positions = response.json()["choices"][0]["prompt_logprobs"][len(prompt) :]
    return [position[str(token)]["logprob"] for position, token in zip(positions, answer, strict=True)]


async def test_strict_required_train_call_records_the_policys_own_logprobs(
    ledger: ServiceProcess, proxy_url: str, cpu_engine: Engine
) -> None:
    async with LedgerClient(ledger.address, KEY) as client:
        endpoint = model_pb2.ModelEndpoint(model_name=cpu_engine.model_name, endpoint=cpu_engine.openai_url)
        await client.register_models([endpoint])
        rollout_id = f"ro-{uuid.uuid4().hex[:12]}"
        spec = rollout_pb2.RolloutSpec(rollout_id=rollout_id, input_json="{}", is_train=True)
        await client.create_rollouts([spec])
        await client.update_status(rollout_id, rollout_pb2.ROLLOUT_STATE_RUNNING, attempt_id="at-1")
        base = f"{proxy_url}/proxy/rollout/{rollout_id}/attempt/at-1/mode/train/openai/v1"
        body = {
            "model": "gpt-4o",
            "messages": [{"role": "user", "content": "Use the calculator: what is 4 + 4?"}],
            "tools": [TOOL],
            "tool_choice": "required",
            "max_tokens": 24,
            "seed": 7,
        }
        answer = httpx.post(f"{base}/chat/completions", json=body, headers={"authorization": f"Bearer {KEY}"})
        assert answer.status_code == 200, answer.text
        (event,) = await client.list_events(rollout_id, event_type="model_request")
    recorded = event.model_request
    sent = json.loads(recorded.request_json)
    assert sent["tool_choice"] == "auto" and "strict" not in sent["tools"][0]["function"]
    assert any("`tool_choice` (required)" in warning for warning in recorded.warnings)
    assert recorded.has_response_logprobs and len(recorded.response_logprobs) == len(recorded.response_token_ids) > 0
    again = rescored(cpu_engine, list(recorded.prompt_token_ids), list(recorded.response_token_ids))
    gap = max(abs(a - b) for a, b in zip(recorded.response_logprobs, again, strict=True))
    assert gap <= 1e-4, (gap, list(recorded.response_logprobs), again)
