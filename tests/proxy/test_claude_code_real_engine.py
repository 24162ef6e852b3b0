"""Claude Code's Messages requests against the real CPU vLLM engine (vLLM 0.32, the tiny model and its template):
a system turn inside `messages` and `thinking` are taken by the real template, and count_tokens (vLLM's own
/tokenize) counts exactly the prompt the same call is sent as."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import anthropic
import pytest

from services._gen.agl.v1 import event_pb2, model_pb2, rollout_pb2
from services.client import LedgerClient
from tests.support.engine import Engine
from tests.support.procs import (
    ServiceProcess,
    start_ledger,
    start_proxy_for_engine,
)

KEY = "claude-code-engine-key"
TOOL = {
    "name": "Bash",
    "description": "Runs a shell command.",
    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
    "cache_control": {"type": "ephemeral"},
}


@pytest.fixture(scope="module")
def ledger() -> Iterator[ServiceProcess]:
    with start_ledger(key=KEY) as process:
        yield process


@pytest.fixture(scope="module")
def proxy_url(ledger: ServiceProcess, cpu_engine: Engine) -> Iterator[str]:
    with start_proxy_for_engine(ledger.address, cpu_engine.model_name, KEY) as url:
        yield url


@pytest.fixture
async def client(ledger: ServiceProcess) -> LedgerClient:
    async with LedgerClient(ledger.address, KEY) as ledger_client:
        yield ledger_client


async def test_a_claude_code_call_and_its_count_on_the_real_engine(
    proxy_url: str, cpu_engine: Engine, client: LedgerClient
) -> None:
    endpoint = model_pb2.ModelEndpoint(model_name=cpu_engine.model_name, endpoint=cpu_engine.openai_url, version=1)
    await client.register_models([endpoint])
    rollout_id = f"ro-{uuid.uuid4().hex[:12]}"
    await client.create_rollouts([rollout_pb2.RolloutSpec(rollout_id=rollout_id, input_json="{}", is_train=True)])
    await client.update_status(rollout_id, rollout_pb2.ROLLOUT_STATE_RUNNING, attempt_id="at-1")
    base = f"{proxy_url}/proxy/rollout/{rollout_id}/attempt/at-1/mode/train/openai"
    request = {
        "model": "claude-sonnet-4-5-20250929",
        "system": [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": "What is 4 + 4?"},
            {"role": "system", "content": "Answer with a number."},
        ],
        "tools": [TOOL],
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "extra_headers": {"anthropic-beta": "claude-code-20250219"},
    }
    # A later turn as Claude Code sends it back: thinking (the engine's reasoning), a tool call, its result.
    history = [
        *request["messages"],
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Add them.", "signature": ""},
            {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "echo $((4+4))"}},
        ]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "8"}]},
    ]  # fmt: skip
    with anthropic.Anthropic(base_url=base, api_key=KEY, max_retries=0) as sdk:
        counted = [sdk.messages.count_tokens(**request), sdk.messages.count_tokens(**{**request, "messages": history})]
        answers = [
            sdk.messages.create(max_tokens=8, metadata={"user_id": "u1"}, **request),
            sdk.messages.create(max_tokens=8, **{**request, "messages": history}),
        ]
    recorded = [e.model_request for e in await client.list_events(rollout_id, event_type="model_request")]
    assert len(recorded) == 2
    for count, answer, call in zip(counted, answers, recorded, strict=True):
        assert call.status == event_pb2.MODEL_REQUEST_STATUS_OK and call.prompt_token_ids
        assert count.input_tokens == len(call.prompt_token_ids) == answer.usage.input_tokens
