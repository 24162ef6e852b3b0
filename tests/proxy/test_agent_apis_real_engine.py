"""The Messages and Responses APIs through the proxy in front of the real CPU vLLM engine (vLLM 0.32, the tiny
model): the SDKs parse the translated answers and streams of a real engine, and the recorded token ids and
log-probs are the engine's own (a direct greedy chat call with the same messages gives the same tokens)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import anthropic
import httpx
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

KEY = "agent-api-engine-key"
QUESTION = "What is 4 + 4?"


@pytest.fixture(scope="module")
def ledger() -> Iterator[ServiceProcess]:
    with start_ledger(key=KEY) as process:
        yield process


@pytest.fixture(scope="module")
def proxy_url(ledger: ServiceProcess, cpu_engine: Engine) -> Iterator[str]:
    # greedy, so a direct call can repeat the engine's answer
    with start_proxy_for_engine(ledger.address, cpu_engine.model_name, KEY, ["--train-temperature", "0"]) as url:
        yield url


async def rollout(client: LedgerClient, engine: Engine) -> str:
    endpoint = model_pb2.ModelEndpoint(model_name=engine.model_name, endpoint=engine.openai_url, version=1)
    await client.register_models([endpoint])
    rollout_id = f"ro-{uuid.uuid4().hex[:12]}"
    await client.create_rollouts([rollout_pb2.RolloutSpec(rollout_id=rollout_id, input_json="{}", is_train=True)])
    await client.update_status(rollout_id, rollout_pb2.ROLLOUT_STATE_RUNNING, attempt_id="at-1")
    return rollout_id


def direct_greedy(engine: Engine, messages: list[dict[str, str]], max_tokens: int) -> dict:
    body = {"model": engine.model_name, "messages": messages, "max_tokens": max_tokens, "temperature": 0}
    body.update(logprobs=True, return_token_ids=True)
    response = httpx.post(f"{engine.openai_url}/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def assert_is_the_engines(recorded: event_pb2.ModelRequest, direct: dict) -> None:
    choice = direct["choices"][0]
    assert list(recorded.prompt_token_ids) == direct["prompt_token_ids"]
    assert list(recorded.response_token_ids) == choice["token_ids"] and recorded.response_token_ids
    logprobs = [entry["logprob"] for entry in choice["logprobs"]["content"]]
    assert recorded.has_response_logprobs and list(recorded.response_logprobs) == pytest.approx(logprobs, abs=1e-4)
    assert recorded.status == event_pb2.MODEL_REQUEST_STATUS_OK


async def test_messages_and_responses_on_the_real_engine(
    ledger: ServiceProcess, proxy_url: str, cpu_engine: Engine
) -> None:
    async with LedgerClient(ledger.address, KEY) as client:
        rollout_id = await rollout(client, cpu_engine)
        base = f"{proxy_url}/proxy/rollout/{rollout_id}/attempt/at-1/mode/train/openai/v1"
        direct = direct_greedy(cpu_engine, [{"role": "user", "content": QUESTION}], 12)
        expected_text = direct["choices"][0]["message"]["content"]

        with anthropic.Anthropic(base_url=base.removesuffix("/v1"), api_key=KEY, max_retries=0) as agent:
            message = agent.messages.create(model="m", max_tokens=12, messages=[{"role": "user", "content": QUESTION}])
            with agent.messages.stream(
                model="m", max_tokens=12, messages=[{"role": "user", "content": QUESTION}]
            ) as stream:
                streamed = stream.get_final_message()
            # A prefill: vLLM continues the assistant's text instead of starting a new turn.
            prefill = [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": "The answer"}]
            continued = agent.messages.create(model="m", max_tokens=4, messages=prefill)
        with openai.OpenAI(base_url=base, api_key=KEY, max_retries=0) as agent:
            response = agent.responses.create(model="m", input=QUESTION, max_output_tokens=12)
            with agent.responses.stream(model="m", input=QUESTION, max_output_tokens=12) as events:
                streamed_response = events.get_final_response()

        calls = [e.model_request for e in await client.list_events(rollout_id, event_type="model_request")]
    prefilled = calls.pop(2)
    sent = json.loads(prefilled.request_json)
    assert sent["continue_final_message"] is True and sent["add_generation_prompt"] is False
    assert continued.content and prefilled.status == event_pb2.MODEL_REQUEST_STATUS_OK
    answer_ids = httpx.post(
        f"{cpu_engine.url}/tokenize", json={"model": cpu_engine.model_name, "prompt": "The answer"}, timeout=30
    ).json()["tokens"]
    # The prompt ends with the prefill's own tokens: no end-of-turn and no new assistant header after them.
    assert list(prefilled.prompt_token_ids[-len(answer_ids) :]) == answer_ids
    assert [call.api for call in calls] == ["anthropic.messages"] * 2 + ["openai.responses"] * 2
    assert [call.stream for call in calls] == [False, True, False, True]
    for call in calls:
        assert_is_the_engines(call, direct)
        assert json.loads(call.request_json)["return_token_ids"] is True
    texts = [
        "".join(block.text for block in message.content if block.type == "text"),
        "".join(block.text for block in streamed.content if block.type == "text"),
        response.output_text,
        streamed_response.output_text,
    ]
    assert texts == [expected_text] * 4
    finish = direct["choices"][0]["finish_reason"]
    assert message.stop_reason == ("max_tokens" if finish == "length" else "end_turn")
    assert response.status == ("incomplete" if finish == "length" else "completed")
    assert message.usage.output_tokens == streamed.usage.output_tokens == len(calls[0].response_token_ids)


async def test_harness_limits_and_codex_tools_on_the_real_engine(
    ledger: ServiceProcess, proxy_url: str, cpu_engine: Engine
) -> None:
    """vLLM 0.32 itself: a Claude-Code-sized max_tokens against the tiny model's 512 positions is answered (sent as
    max_model_len, read from the engine's /v1/models; vLLM grants what the prompt leaves), and a Codex request with
    namespace, custom and built-in tools is accepted by the engine's chat path."""
    max_model_len = httpx.get(f"{cpu_engine.openai_url}/models", timeout=30).json()["data"][0]["max_model_len"]
    async with LedgerClient(ledger.address, KEY) as client:
        rollout_id = await rollout(client, cpu_engine)
        base = f"{proxy_url}/proxy/rollout/{rollout_id}/attempt/at-1/mode/train/openai/v1"
        headers = {"authorization": f"Bearer {KEY}"}
        chat = {"model": "m", "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 32_000}
        answered = httpx.post(f"{base}/chat/completions", json=chat, headers=headers, timeout=300)
        assert answered.status_code == 200, answered.text
        codex = {
            "model": "gpt-5.1-codex",
            "input": [
                {"type": "additional_tools", "role": "developer", "tools": [{"type": "custom", "name": "exec"}]},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION}]},
            ],
            "tools": [
                {"type": "web_search"},
                {"type": "namespace", "name": "mcp__calc__", "description": "Calculator.", "tools": [
                    {"type": "function", "name": "add", "parameters": {"type": "object", "properties": {}}},
                ]},
            ],
            "max_output_tokens": 64_000,
            "reasoning": {"effort": "medium"},
            "store": False,
        }  # fmt: skip
        codex_answer = httpx.post(f"{base}/responses", json=codex, headers=headers, timeout=300)
        assert codex_answer.status_code == 200, codex_answer.text
        first, second = [e.model_request for e in await client.list_events(rollout_id, event_type="model_request")]
    assert max_model_len < 32_000  # the tiny model: far fewer positions than a harness asks for
    for recorded, asked in ((first, 32_000), (second, 64_000)):
        assert recorded.status == event_pb2.MODEL_REQUEST_STATUS_OK and recorded.response_token_ids
        assert json.loads(recorded.request_json)["max_tokens"] == max_model_len
        assert recorded.requested_max_tokens == asked
        assert recorded.granted_max_tokens == max_model_len - len(recorded.prompt_token_ids)
    sent = json.loads(second.request_json)
    assert [tool["function"]["name"] for tool in sent["tools"]] == ["mcp__calc__add", "exec"]
    assert len(second.warnings) == 1 and "'web_search'" in second.warnings[0]
