"""The real ledger and proxy in front of the real CPU engine: an agent's call is answered by vLLM and the ledger
records exactly the token ids and log-probs the engine produced (what the trainer will learn from)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import openai
import pytest

from services._gen.agl.v1 import event_pb2, model_pb2, rollout_pb2
from services.client import LedgerClient
from tests.support.engine import Engine
from tests.support.procs import (
    ServiceProcess,
    start_ledger,
    start_proxy_for_engine,
)

KEY = "engine-test-master-key"


@pytest.fixture(scope="module")
def ledger() -> Iterator[ServiceProcess]:
    with start_ledger(key=KEY) as process:
        yield process


@pytest.fixture(scope="module")
def proxy_url(ledger: ServiceProcess, cpu_engine: Engine) -> Iterator[str]:
    with start_proxy_for_engine(ledger.address, cpu_engine.model_name, KEY) as url:
        yield url


async def test_a_call_through_the_proxy_is_recorded_with_the_engines_tokens_and_logprobs(
    ledger: ServiceProcess, proxy_url: str, cpu_engine: Engine
) -> None:
    async with LedgerClient(ledger.address, KEY) as client:
        endpoint = model_pb2.ModelEndpoint(model_name=cpu_engine.model_name, endpoint=cpu_engine.openai_url, version=3)
        await client.register_models([endpoint])
        rollout_id = f"ro-{uuid.uuid4().hex[:12]}"
        spec = rollout_pb2.RolloutSpec(rollout_id=rollout_id, input_json="{}", is_train=True)
        await client.create_rollouts([spec])
        await client.update_status(rollout_id, rollout_pb2.ROLLOUT_STATE_RUNNING, attempt_id="at-1")

        base_url = f"{proxy_url}/proxy/rollout/{rollout_id}/attempt/at-1/mode/train/openai/v1"
        async with openai.AsyncOpenAI(base_url=base_url, api_key=KEY, max_retries=0) as sdk:
            # The agent names any model and asks for neither token ids nor log-probs: the proxy forces both.
            completion = await sdk.chat.completions.create(
                model="whatever-the-agent-says", messages=[{"role": "user", "content": "What is 4 + 4?"}], max_tokens=12
            )
        choice = completion.choices[0]
        response_ids = choice.model_extra["token_ids"]
        logprobs = [entry.logprob for entry in choice.logprobs.content]
        assert 1 <= len(response_ids) <= 12 and len(logprobs) == len(response_ids)

        (event,) = await client.list_events(rollout_id, event_type="model_request")
    recorded = event.model_request
    assert list(recorded.prompt_token_ids) == completion.model_extra["prompt_token_ids"]
    assert len(recorded.prompt_token_ids) > len("What is 4 + 4?")
    assert list(recorded.response_token_ids) == response_ids
    assert recorded.has_response_logprobs and list(recorded.response_logprobs) == pytest.approx(logprobs, abs=1e-6)
    assert all(lp <= 0.0 for lp in recorded.response_logprobs)
    assert recorded.status == event_pb2.MODEL_REQUEST_STATUS_OK and recorded.http_status == 200
    assert recorded.model == "agl-policy" and recorded.model_version == 3
    assert recorded.endpoint == cpu_engine.openai_url
    sent = json.loads(recorded.request_json)
    assert sent["model"] == "agl-policy" and sent["return_token_ids"] is True and sent["logprobs"] is True
    assert json.loads(recorded.response_json)["choices"][0]["token_ids"] == response_ids
