"""Model calls through the proxy with the official OpenAI SDK and raw HTTP: what the agent gets, what the engine
was sent, and what the ledger recorded must agree exactly."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from services._gen.agl.v1 import event_pb2
from services.client import LedgerClient
from services.standin.tokenizer import token_logprob

from .conftest import AUTH, KEY, MODEL, Http, base_url, engine_requests, new_rollout

CALC_TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluates an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}


async def calls_of(client: LedgerClient, rollout_id: str) -> list[event_pb2.ModelRequest]:
    events = await client.list_events(rollout_id, event_type="model_request")
    return [event.model_request for event in events]


def last_engine_body(engine: Http) -> dict[str, Any]:
    return engine_requests(engine)["received"][-1]["body"]


async def test_chat_sync_sdk_captures_exactly_what_the_engine_returned(proxy: Http, engine: Http, client) -> None:
    rollout_id = await new_rollout(client)
    sdk = openai.OpenAI(base_url=base_url(proxy, rollout_id), api_key=KEY, max_retries=0)
    completion = sdk.chat.completions.create(
        model="agent-chosen-name",
        messages=[{"role": "user", "content": "What is 6 * 7?"}],
        temperature=1.7,
        seed=11,
        max_tokens=50,
        extra_body={"top_k": 5},
    )
    sdk.close()
    choice = completion.choices[0]
    assert choice.message.content == "The answer is 42."
    sent = last_engine_body(engine)
    assert sent["model"] == MODEL and sent["temperature"] == 1.0  # the proxy's train temperature
    assert sent["return_token_ids"] is True and sent["logprobs"] is True
    assert sent["seed"] == 11 and sent["max_tokens"] == 50
    assert sent["top_k"] == 0  # the agent's top_k would make the train sample off-policy: the whole distribution

    (recorded,) = await calls_of(client, rollout_id)
    assert list(recorded.prompt_token_ids) == completion.model_extra["prompt_token_ids"]
    assert list(recorded.response_token_ids) == choice.model_extra["token_ids"]
    assert list(recorded.response_logprobs) == [entry.logprob for entry in choice.logprobs.content]
    assert list(recorded.response_logprobs) == [token_logprob(t, i) for i, t in enumerate(recorded.response_token_ids)]
    assert recorded.has_response_logprobs and recorded.status == event_pb2.MODEL_REQUEST_STATUS_OK
    assert json.loads(recorded.request_json) == sent
    assert json.loads(recorded.response_json)["choices"][0]["message"]["content"] == "The answer is 42."
    assert recorded.api == "chat.completions" and not recorded.stream
    assert recorded.http_status == 200 and recorded.retry_count == 0 and recorded.finish_reason == "stop"
    assert recorded.model == MODEL and recorded.model_version == 1 and recorded.endpoint == f"{engine.url}/v1"
    assert recorded.usage.completion_tokens == len(recorded.response_token_ids)
    assert recorded.latency_seconds > 0


async def test_completions_async_sdk_captures_per_choice_prompt_ids(proxy: Http, engine: Http, client) -> None:
    rollout_id = await new_rollout(client)
    async with openai.AsyncOpenAI(base_url=base_url(proxy, rollout_id), api_key=KEY, max_retries=0) as sdk:
        completion = await sdk.completions.create(model=MODEL, prompt="Q: What is 20 plus 22?\nA:", max_tokens=20)
    choice = completion.choices[0]
    assert choice.text == " The answer is 42."
    sent = last_engine_body(engine)
    assert sent["logprobs"] == 1 and sent["return_token_ids"] is True
    (recorded,) = await calls_of(client, rollout_id)
    assert list(recorded.prompt_token_ids) == choice.model_extra["prompt_token_ids"]
    assert list(recorded.response_token_ids) == choice.model_extra["token_ids"]
    assert list(recorded.response_logprobs) == choice.logprobs.token_logprobs
    assert recorded.api == "completions"


async def test_chat_stream_sdk_forwards_chunks_and_records_the_assembled_call(proxy: Http, client) -> None:
    rollout_id = await new_rollout(client)
    async with openai.AsyncOpenAI(base_url=base_url(proxy, rollout_id), api_key=KEY, max_retries=0) as sdk:
        stream = await sdk.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "What is 100 - 58?"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "The answer is 42."
    streamed_ids = [t for c in chunks if c.choices for t in c.choices[0].model_extra.get("token_ids") or []]
    streamed_logprobs = [
        e.logprob for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content
    ]
    prompt_ids = next(c.model_extra["prompt_token_ids"] for c in chunks if c.model_extra.get("prompt_token_ids"))
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None

    (recorded,) = await calls_of(client, rollout_id)
    assert recorded.stream and recorded.status == event_pb2.MODEL_REQUEST_STATUS_OK
    assert list(recorded.prompt_token_ids) == prompt_ids
    assert list(recorded.response_token_ids) == streamed_ids and len(streamed_ids) == 4
    assert list(recorded.response_logprobs) == streamed_logprobs
    assert recorded.usage.total_tokens == usage.total_tokens and recorded.finish_reason == "stop"
    assembled = json.loads(recorded.response_json)
    assert assembled["choices"][0]["message"]["content"] == text


async def test_completions_stream_raw_http_ends_with_done_after_recording(proxy: Http, client) -> None:
    rollout_id = await new_rollout(client)
    body = {"model": MODEL, "prompt": "7 * 6 =", "stream": True}
    lines = []
    with httpx.stream("POST", f"{base_url(proxy, rollout_id)}/completions", json=body, headers=AUTH) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[len("data: ") :]) for line in lines[:-1]]
    (recorded,) = await calls_of(client, rollout_id)
    assert list(recorded.prompt_token_ids) == chunks[0]["choices"][0]["prompt_token_ids"]
    assert list(recorded.response_token_ids) == [t for c in chunks for t in c["choices"][0]["token_ids"]]
    assert list(recorded.response_logprobs) == [
        v for c in chunks for v in c["choices"][0]["logprobs"]["token_logprobs"]
    ]
    assert "".join(c["choices"][0]["text"] for c in chunks) == " The answer is 42."


@pytest.mark.parametrize("stream", [False, True])
async def test_tool_call_round_trip(proxy: Http, client, stream: bool) -> None:
    rollout_id = await new_rollout(client)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 12 * 12?"}]
    sdk = openai.OpenAI(base_url=base_url(proxy, rollout_id), api_key=KEY, max_retries=0)
    if stream:
        chunks = list(sdk.chat.completions.create(model=MODEL, messages=messages, tools=[CALC_TOOL], stream=True))
        fragments = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
        call_id, name = fragments[0].id, fragments[0].function.name
        arguments = "".join(f.function.arguments or "" for f in fragments)
    else:
        message = sdk.chat.completions.create(model=MODEL, messages=messages, tools=[CALC_TOOL]).choices[0].message
        call_id, name, arguments = (
            message.tool_calls[0].id,
            message.tool_calls[0].function.name,
            message.tool_calls[0].function.arguments,
        )
    assert name == "calculator" and json.loads(arguments) == {"expression": "12 * 12"}
    messages.append(
        {
            "role": "assistant",
            "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}],
        }
    )
    messages.append({"role": "tool", "tool_call_id": call_id, "content": "144"})
    answer = sdk.chat.completions.create(model=MODEL, messages=messages, tools=[CALC_TOOL])
    sdk.close()
    assert answer.choices[0].message.content == "The answer is 144."
    first, second = await calls_of(client, rollout_id)
    assert first.finish_reason == "tool_calls" and first.stream == stream and first.response_token_ids
    # The proxy counted what became of the model's tool calls (one parsed, of the one tool offered).
    counts = (first.tool_calls.offered_tools, first.tool_calls.parsed_calls, first.tool_calls.unparsed_calls)
    assert counts == (1, 1, 0)
    assert (second.tool_calls.offered_tools, second.tool_calls.parsed_calls) == (1, 0)
    assembled_calls = json.loads(first.response_json)["choices"][0]["message"]["tool_calls"]
    assert json.loads(assembled_calls[0]["function"]["arguments"]) == {"expression": "12 * 12"}
    assert json.loads(second.request_json)["messages"][-1]["content"] == "144"


async def test_val_mode_sets_only_model_temperature_and_token_ids(proxy: Http, engine: Http, client) -> None:
    rollout_id = await new_rollout(client)
    body = {"model": "x", "messages": [{"role": "user", "content": "hello there"}], "temperature": 0.9}
    response = httpx.post(f"{base_url(proxy, rollout_id, mode='val')}/chat/completions", json=body, headers=AUTH)
    assert response.status_code == 200
    sent = last_engine_body(engine)
    assert sent == {**body, "model": MODEL, "temperature": 0.0, "return_token_ids": True}
    assert response.json()["choices"][0]["token_ids"]  # what v1.0's agents may decode, in validation too
    (recorded,) = await calls_of(client, rollout_id)
    assert not recorded.has_response_logprobs and list(recorded.response_logprobs) == []
    assert list(recorded.response_token_ids) == response.json()["choices"][0]["token_ids"]


async def test_models_route_names_the_configured_model(proxy: Http, client) -> None:
    rollout_id = await new_rollout(client)
    sdk = openai.OpenAI(base_url=base_url(proxy, rollout_id), api_key=KEY, max_retries=0)
    assert [m.id for m in sdk.models.list()] == [MODEL]
    sdk.close()
