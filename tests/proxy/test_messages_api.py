"""The Anthropic Messages API through the proxy with the official `anthropic` SDK: answers parse, tools work both
ways, streams arrive as Messages events, errors come in Anthropic's shape, and every call is recorded with the
engine's own token ids and log-probs before the agent has its answer."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import anthropic
import httpx
import pytest

from services._gen.agl.v1 import event_pb2
from services.client import LedgerClient, agent_token
from services.standin.tokenizer import token_logprob

from .conftest import KEY, MODEL, Http, base_url, engine_requests, new_rollout, run_proxy, set_engine

CALCULATOR = {
    "name": "calculator",
    "description": "Evaluates an arithmetic expression.",
    "input_schema": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
}
QUESTION = [{"role": "user", "content": "What is 6 * 7?"}]


def sdk(proxy: Http, rollout_id: str, **kwargs: Any) -> anthropic.Anthropic:
    # The SDK appends /v1/messages to its base URL: the agent's OpenAI base URL without its /v1.
    url = base_url(proxy, rollout_id, mode=kwargs.pop("mode", "train")).removesuffix("/v1")
    return anthropic.Anthropic(base_url=url, api_key=kwargs.pop("api_key", KEY), max_retries=0, **kwargs)


async def recorded_calls(client: LedgerClient, rollout_id: str) -> list[event_pb2.ModelRequest]:
    return [e.model_request for e in await client.list_events(rollout_id, event_type="model_request")]


def engine_answer(recorded: event_pb2.ModelRequest) -> dict[str, Any]:
    return json.loads(recorded.response_json)["choices"][0]


def assert_engine_tokens(recorded: event_pb2.ModelRequest) -> None:
    """The event's token fields are exactly the engine's chat answer's, log-probs included."""
    engine = json.loads(recorded.response_json)
    choice = engine["choices"][0]
    assert list(recorded.prompt_token_ids) == engine["prompt_token_ids"] and recorded.prompt_token_ids
    assert list(recorded.response_token_ids) == choice["token_ids"] and recorded.response_token_ids
    assert list(recorded.response_logprobs) == [entry["logprob"] for entry in choice["logprobs"]["content"]]
    assert list(recorded.response_logprobs) == [token_logprob(t, i) for i, t in enumerate(recorded.response_token_ids)]
    assert recorded.has_response_logprobs and recorded.status == event_pb2.MODEL_REQUEST_STATUS_OK


async def test_text_answer_is_a_message_and_recorded_with_the_engines_tokens(proxy: Http, engine: Http, client) -> None:
    rollout_id = await new_rollout(client)
    with sdk(proxy, rollout_id) as agent:
        message = agent.messages.create(
            model="any-model",
            max_tokens=64,
            system="You are terse.",
            messages=QUESTION,
            extra_body={"temperature": 0.3},
        )
        # Recorded before the answer: the event is there the moment the SDK returns.
        (recorded,) = await recorded_calls(client, rollout_id)
    assert message.type == "message" and message.role == "assistant"
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].text == "The answer is 42."
    assert message.stop_reason == "end_turn" and message.model == MODEL
    assert message.usage.output_tokens == len(recorded.response_token_ids)
    assert message.usage.input_tokens == len(recorded.prompt_token_ids)
    assert_engine_tokens(recorded)
    assert recorded.api == "anthropic.messages" and not recorded.stream and recorded.http_status == 200
    sent = engine_requests(engine)["received"][-1]
    assert sent["path"] == "/v1/chat/completions"
    assert sent["body"]["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 6 * 7?"},
    ]
    assert sent["body"]["model"] == MODEL and sent["body"]["max_tokens"] == 64
    assert sent["body"]["return_token_ids"] is True and sent["body"]["logprobs"] is True
    assert sent["body"]["temperature"] == 1.0  # the proxy's train temperature, not the agent's
    assert json.loads(recorded.request_json) == sent["body"]


async def test_tool_use_round_trip(proxy: Http, engine: Http, client) -> None:
    rollout_id = await new_rollout(client)
    # With the agent's own per-rollout token (AGL_KEY), which the SDK sends as x-api-key.
    with sdk(proxy, rollout_id, api_key=agent_token(KEY, rollout_id, "at-1")) as agent:
        first = agent.messages.create(model="m", max_tokens=64, messages=QUESTION, tools=[CALCULATOR])
        (call,) = first.content
        assert call.type == "tool_use" and call.name == "calculator" and call.input == {"expression": "6 * 7"}
        assert first.stop_reason == "tool_use"
        turns = [
            *QUESTION,
            {"role": "assistant", "content": [block.model_dump() for block in first.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "42"}]},
        ]
        second = agent.messages.create(model="m", max_tokens=64, messages=turns, tools=[CALCULATOR])
    assert second.content[0].text == "The answer is 42." and second.stop_reason == "end_turn"
    sent = engine_requests(engine)["received"][-1]["body"]
    assert sent["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "calculator",
                "parameters": CALCULATOR["input_schema"],
                "description": CALCULATOR["description"],
            },
        }
    ]
    assistant, tool = sent["messages"][1:]
    assert assistant["tool_calls"][0]["id"] == call.id
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == {"expression": "6 * 7"}
    assert tool == {"role": "tool", "tool_call_id": call.id, "content": "42"}
    calls = await recorded_calls(client, rollout_id)
    assert len(calls) == 2
    for recorded in calls:
        assert_engine_tokens(recorded)
    assert engine_answer(calls[0])["finish_reason"] == "tool_calls" and calls[0].finish_reason == "tool_calls"
    # The second prompt holds the first call's tool call: it is a continuation of the same trajectory.
    assert len(calls[1].prompt_token_ids) > len(calls[0].prompt_token_ids)


async def test_forced_tool_choice_and_stop_sequences_are_translated(proxy: Http, engine: Http, client) -> None:
    rollout_id = await new_rollout(client)
    with sdk(proxy, rollout_id, mode="val") as agent:  # train calls leave a forced choice out (test_free_sampling)
        agent.messages.create(
            model="m",
            max_tokens=64,
            messages=QUESTION,
            tools=[CALCULATOR],
            tool_choice={"type": "tool", "name": "calculator", "disable_parallel_tool_use": True},
        )
        sent = engine_requests(engine)["received"][-1]["body"]
        assert sent["tool_choice"] == {"type": "function", "function": {"name": "calculator"}}
        assert sent["parallel_tool_calls"] is False
        cut = agent.messages.create(model="m", max_tokens=3, messages=QUESTION, stop_sequences=["never"])
    assert engine_requests(engine)["received"][-1]["body"]["stop"] == ["never"]
    assert cut.stop_reason == "max_tokens"
    calls = await recorded_calls(client, rollout_id)
    assert len(calls[1].response_token_ids) == 3


async def test_stream_arrives_as_messages_events_and_is_recorded_whole(proxy: Http, engine: Http, client) -> None:
    rollout_id = await new_rollout(client)
    with sdk(proxy, rollout_id) as agent:
        with agent.messages.stream(model="m", max_tokens=64, messages=QUESTION) as stream:
            pieces = list(stream.text_stream)
            final = stream.get_final_message()
        (recorded,) = await recorded_calls(client, rollout_id)
        raw = agent.messages.create(model="m", max_tokens=64, messages=QUESTION, stream=True)
        kinds = [event.type for event in raw]
    assert len(pieces) > 3 and "".join(pieces) == "The answer is 42."
    assert final.content[0].text == "The answer is 42." and final.stop_reason == "end_turn"
    assert final.usage.output_tokens == len(recorded.response_token_ids)
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert_engine_tokens(recorded)
    assert recorded.stream and recorded.api == "anthropic.messages"
    assert engine_requests(engine)["received"][-1]["body"]["stream_options"] == {"include_usage": True}


async def test_streamed_tool_use_assembles_into_a_tool_use_block(proxy: Http, client) -> None:
    rollout_id = await new_rollout(client)
    agent = sdk(proxy, rollout_id)
    with agent, agent.messages.stream(model="m", max_tokens=64, messages=QUESTION, tools=[CALCULATOR]) as stream:
        final = stream.get_final_message()
    (block,) = final.content
    assert block.type == "tool_use" and block.name == "calculator" and block.input == {"expression": "6 * 7"}
    assert final.stop_reason == "tool_use"
    (recorded,) = await recorded_calls(client, rollout_id)
    assert_engine_tokens(recorded)
    assert recorded.finish_reason == "tool_calls"


async def test_errors_come_in_anthropics_shape(proxy: Http, engine: Http, client) -> None:
    rollout_id = await new_rollout(client)
    with sdk(proxy, rollout_id) as agent, pytest.raises(anthropic.BadRequestError) as bad:
        agent.messages.create(model="m", max_tokens=0, messages=QUESTION)
    assert bad.value.body == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "`max_tokens` is required and must be a positive integer.",
        },
    }
    with sdk(proxy, "ro-never-created") as agent, pytest.raises(anthropic.NotFoundError) as missing:
        agent.messages.create(model="m", max_tokens=8, messages=QUESTION)
    assert missing.value.body["error"]["type"] == "not_found_error"
    assert "ro-never-created" in missing.value.body["error"]["message"]
    with sdk(proxy, rollout_id, api_key="wrong") as agent, pytest.raises(anthropic.AuthenticationError) as denied:
        agent.messages.create(model="m", max_tokens=8, messages=QUESTION)
    assert denied.value.body["error"]["type"] == "authentication_error"
    unsupported = {"type": "web_search_20250305", "name": "web_search"}
    with sdk(proxy, rollout_id) as agent, pytest.raises(anthropic.BadRequestError) as server_tool:
        agent.messages.create(model="m", max_tokens=8, messages=QUESTION, tools=[unsupported])  # type: ignore[list-item]
    assert "server tools are not supported" in server_tool.value.body["error"]["message"]
    assert await recorded_calls(client, rollout_id) == []  # refused before the engine: nothing recorded

    set_engine(engine, fail_next=1, fail_status=400)
    try:
        with sdk(proxy, rollout_id) as agent, pytest.raises(anthropic.BadRequestError) as engine_refused:
            agent.messages.create(model="m", max_tokens=8, messages=QUESTION)
    finally:
        set_engine(engine, fail_next=0, fail_status=503)
    assert engine_refused.value.body["type"] == "error"
    assert engine_refused.value.body["error"] == {
        "type": "invalid_request_error",
        "message": "Engine temporarily failing.",
    }
    (recorded,) = await recorded_calls(client, rollout_id)
    assert recorded.status == event_pb2.MODEL_REQUEST_STATUS_ERROR and recorded.http_status == 400
    assert recorded.api == "anthropic.messages"


async def test_raw_http_with_x_api_key_and_finished_rollout(proxy: Http, client) -> None:
    rollout_id = await new_rollout(client)
    url = f"{base_url(proxy, rollout_id)}/messages"
    headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
    body = {"model": "m", "max_tokens": 32, "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    async with httpx.AsyncClient() as http:
        ok = await http.post(url, json=body, headers=headers)
        assert ok.status_code == 200 and ok.json()["content"][0]["text"] == "OK. You said: hi"
        bad_json = await http.post(url, content=b"{", headers=headers)
        assert bad_json.status_code == 400 and bad_json.json()["type"] == "error"
        assert bad_json.json()["error"]["type"] == "invalid_request_error"
        for method, path in (("GET", "/messages"), ("POST", "/messages/batches")):
            unserved = await http.request(method, f"{base_url(proxy, rollout_id)}{path}", json=body, headers=headers)
            assert unserved.status_code in (404, 405) and unserved.json()["type"] == "error"
            assert unserved.json()["error"]["type"] == "not_found_error"
        await client.update_status(rollout_id, 3)  # succeeded
        done = await http.post(url, json=body, headers=headers)
    assert done.status_code == 409 and done.json()["error"]["type"] == "invalid_request_error"
    assert "has finished" in done.json()["error"]["message"]


async def test_a_failed_engine_stream_ends_with_an_error_event_and_is_recorded(ledger, engine: Http, client) -> None:
    """The engine stalls mid-stream past the proxy's read timeout: the agent's SDK gets Anthropic's error event
    (not a cut connection) and the call is recorded as an error with what had arrived."""
    rollout_id = await new_rollout(client)
    with run_proxy(ledger.address, args=["--read-timeout", "0.3"]) as impatient:
        set_engine(engine, chunk_delay_ms=800)
        try:
            with sdk(impatient, rollout_id) as agent:
                stream = agent.messages.create(model="m", max_tokens=64, messages=QUESTION, stream=True)
                kinds = []
                with pytest.raises(anthropic.APIStatusError) as failed:
                    for event in stream:
                        kinds.append(event.type)
        finally:
            set_engine(engine, chunk_delay_ms=0)
    assert kinds == ["message_start"]  # the engine's first chunk (the role) came, then nothing in time
    assert failed.value.body["type"] == "error" and failed.value.body["error"]["type"] == "api_error"
    assert "The engine stream failed: ReadTimeout" in failed.value.body["error"]["message"]
    (recorded,) = await recorded_calls(client, rollout_id)
    assert recorded.status == event_pb2.MODEL_REQUEST_STATUS_ERROR and recorded.stream
    assert recorded.api == "anthropic.messages" and recorded.prompt_token_ids and not recorded.response_token_ids


async def test_an_agent_leaving_mid_stream_is_recorded_as_incomplete(proxy: Http, engine: Http, client) -> None:
    rollout_id = await new_rollout(client)
    set_engine(engine, chunk_delay_ms=300)
    try:
        with sdk(proxy, rollout_id) as agent:
            stream = agent.messages.create(model="m", max_tokens=64, messages=QUESTION, stream=True)
            for event in stream:
                if event.type == "content_block_delta":
                    break
            stream.close()
        for _ in range(100):
            calls = await recorded_calls(client, rollout_id)
            if calls:
                break
            await asyncio.sleep(0.05)
    finally:
        set_engine(engine, chunk_delay_ms=0)
    (recorded,) = calls
    assert recorded.status == event_pb2.MODEL_REQUEST_STATUS_INCOMPLETE and recorded.api == "anthropic.messages"
    assert 1 <= len(recorded.response_token_ids) < 8 and recorded.prompt_token_ids


async def test_val_mode_stream_reports_input_tokens_at_the_end(proxy: Http, engine: Http, client) -> None:
    """In val mode (token ids, no log-probs forced) the stream's usage still comes whole with message_delta."""
    rollout_id = await new_rollout(client)
    url = base_url(proxy, rollout_id, mode="val").removesuffix("/v1")
    agent = anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0)
    with agent, agent.messages.stream(model="m", max_tokens=64, messages=QUESTION) as stream:
        final = stream.get_final_message()
    sent = engine_requests(engine)["received"][-1]["body"]
    assert sent["return_token_ids"] is True and "logprobs" not in sent and sent["temperature"] == 0.0
    (recorded,) = await recorded_calls(client, rollout_id)
    assert final.content[0].text == "The answer is 42."
    assert final.usage.input_tokens == recorded.usage.prompt_tokens > 0
