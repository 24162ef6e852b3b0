"""Failure handling: engine retries and errors, auth scoping, unknown and finished rollouts, bad bodies, rewards,
and a client that goes away mid-stream."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import httpx
import openai
import pytest

from services._gen.agl.v1 import event_pb2, rollout_pb2
from services.client import LedgerClient, agent_token
from tests.support.procs import ServiceProcess

from .conftest import AUTH, KEY, MODEL, Http, base_url, engine_requests, event_url, new_rollout, run_proxy, set_engine

BODY_LIMIT = 64 * 1024
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "What is 2 + 2?"}]}


@pytest.fixture(scope="module")
def proxy(ledger: ServiceProcess, engine: Http) -> Iterator[Http]:
    with run_proxy(ledger.address, args=["--max-body-bytes", str(BODY_LIMIT), "--retry-attempts", "4"]) as process:
        yield process


@pytest.fixture(autouse=True)
def healthy_engine(engine: Http) -> Iterator[None]:
    set_engine(engine, fail_next=0, delay_ms=0)
    yield
    set_engine(engine, fail_next=0, delay_ms=0)


async def recorded(client: LedgerClient, rollout_id: str) -> list[event_pb2.Event]:
    return await client.list_events(rollout_id)


def post_chat(proxy: Http, rollout_id: str, body: object = CHAT, headers: dict | None = None, **kw) -> httpx.Response:
    return httpx.post(
        f"{base_url(proxy, rollout_id)}/chat/completions", json=body, headers=AUTH if headers is None else headers, **kw
    )


# -- engine failures ---------------------------------------------------------------------------------------------


async def test_engine_failing_then_recovering_is_retried_and_the_retry_count_recorded(proxy, engine, client) -> None:
    rollout_id = await new_rollout(client)
    before = engine_requests(engine)["requests"]
    set_engine(engine, fail_next=2, fail_status=503)
    sdk = openai.OpenAI(base_url=base_url(proxy, rollout_id), api_key=KEY, max_retries=0)
    answer = sdk.chat.completions.create(**CHAT)
    sdk.close()
    assert answer.choices[0].message.content == "The answer is 4."
    assert engine_requests(engine)["requests"] - before == 3
    (event,) = await recorded(client, rollout_id)
    assert event.model_request.retry_count == 2 and event.model_request.status == event_pb2.MODEL_REQUEST_STATUS_OK


async def test_retries_exhausted_pass_the_engine_error_through_and_record_it(proxy, engine, client) -> None:
    rollout_id = await new_rollout(client)
    set_engine(engine, fail_next=4, fail_status=503)
    response = post_chat(proxy, rollout_id)
    assert response.status_code == 503 and response.json()["error"]["message"] == "Engine temporarily failing."
    (event,) = await recorded(client, rollout_id)
    call = event.model_request
    assert call.status == event_pb2.MODEL_REQUEST_STATUS_ERROR and call.http_status == 503 and call.retry_count == 3
    assert json.loads(call.response_json)["error"]["message"] == "Engine temporarily failing."


async def test_upstream_400_is_passed_through_not_retried_and_recorded_as_error(proxy, engine, client) -> None:
    rollout_id = await new_rollout(client)
    before = engine_requests(engine)["requests"]
    sdk = openai.OpenAI(base_url=base_url(proxy, rollout_id), api_key=KEY, max_retries=0)
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.chat.completions.create(**CHAT, extra_body={"standin": {"status": 400, "message": "max_tokens too large"}})
    sdk.close()
    assert caught.value.status_code == 400 and "max_tokens too large" in str(caught.value)
    assert engine_requests(engine)["requests"] - before == 1
    (event,) = await recorded(client, rollout_id)
    assert event.model_request.status == event_pb2.MODEL_REQUEST_STATUS_ERROR and event.model_request.http_status == 400
    assert "max_tokens too large" in event.model_request.response_json


# -- request checks ----------------------------------------------------------------------------------------------


async def test_malformed_json_is_400_and_nothing_is_recorded(proxy, client) -> None:
    rollout_id = await new_rollout(client)
    url = f"{base_url(proxy, rollout_id)}/chat/completions"
    response = httpx.post(url, content=b'{"messages": [', headers={**AUTH, "content-type": "application/json"})
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_json"
    assert post_chat(proxy, rollout_id, body={"model": MODEL, "messages": "hi"}).status_code == 400
    assert await recorded(client, rollout_id) == []


async def test_nan_in_a_model_call_is_400_but_a_nan_reward_is_the_422_that_names_it(proxy, client) -> None:
    """Model-call bodies are strict JSON (NaN would otherwise reach the engine changed); an agent's event is parsed
    leniently, so a NaN reward gets the reward check's message."""
    rollout_id = await new_rollout(client)
    url = f"{base_url(proxy, rollout_id)}/chat/completions"
    body = b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}'
    response = httpx.post(url, content=body, headers={**AUTH, "content-type": "application/json"})
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_json"
    reward = httpx.post(
        event_url(proxy, rollout_id),
        content=b'{"event_type": "reward", "data": {"value": NaN}}',
        headers={**AUTH, "content-type": "application/json"},
    )
    assert reward.status_code == 422 and "value" in reward.json()["error"]["message"]
    # Only the proxy's warning about the refused reward is stored (issue 15), never the reward itself.
    assert [e.event_type for e in await recorded(client, rollout_id)] == ["proxy_refused_event"]


async def test_body_over_the_limit_is_413_with_or_without_content_length(proxy, client) -> None:
    rollout_id = await new_rollout(client)
    big = {"model": MODEL, "messages": [{"role": "user", "content": "x" * BODY_LIMIT}]}
    response = post_chat(proxy, rollout_id, body=big)
    assert response.status_code == 413 and response.json()["error"]["type"] == "invalid_request_error"

    def chunked() -> Iterator[bytes]:
        payload = json.dumps(big).encode()
        for start in range(0, len(payload), 8192):
            yield payload[start : start + 8192]

    url = f"{base_url(proxy, rollout_id)}/chat/completions"
    assert httpx.post(url, content=chunked(), headers=AUTH).status_code == 413
    assert await recorded(client, rollout_id) == []


async def test_unknown_route_and_mode_are_openai_shaped_404(proxy, client) -> None:
    rollout_id = await new_rollout(client)
    response = httpx.post(f"{base_url(proxy, rollout_id, mode='test')}/chat/completions", json=CHAT, headers=AUTH)
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"
    assert httpx.get(f"{proxy.url}/nope", headers=AUTH).json()["error"]["code"] == "not_found"


# -- auth --------------------------------------------------------------------------------------------------------


async def test_agent_token_is_valid_only_for_its_own_rollout_and_attempt(proxy, client) -> None:
    rollout_a, rollout_b = await new_rollout(client), await new_rollout(client)
    token_a = {"authorization": f"Bearer {agent_token(KEY, rollout_a, 'at-1')}"}
    assert post_chat(proxy, rollout_a, headers=token_a).status_code == 200
    assert post_chat(proxy, rollout_b, headers=token_a).status_code == 401
    wrong_attempt = httpx.post(f"{base_url(proxy, rollout_a, 'at-2')}/chat/completions", json=CHAT, headers=token_a)
    assert wrong_attempt.status_code == 401
    reward = {"event_type": "reward", "data": {"value": 1.0}}
    assert httpx.post(event_url(proxy, rollout_b), json=reward, headers=token_a).status_code == 401
    assert (
        httpx.post(
            event_url(proxy, rollout_a), json=reward, headers={"x-api-key": agent_token(KEY, rollout_a, "at-1")}
        ).status_code
        == 200
    )
    assert post_chat(proxy, rollout_a, headers={}).status_code == 401
    assert (
        post_chat(proxy, rollout_a, headers={"authorization": "Bearer nope"}).json()["error"]["type"]
        == "authentication_error"
    )
    assert httpx.get(f"{proxy.url}/admin/state", headers=token_a).status_code == 401
    assert httpx.get(f"{proxy.url}/admin/state", headers=AUTH).status_code == 200
    assert len(await recorded(client, rollout_b)) == 0 and len(await recorded(client, rollout_a)) == 2


# -- rollouts ----------------------------------------------------------------------------------------------------


async def test_unknown_rollout_is_404_for_calls_and_events(proxy) -> None:
    assert post_chat(proxy, "ro-does-not-exist").status_code == 404
    reward = {"event_type": "reward", "data": {"value": 1}}
    assert httpx.post(event_url(proxy, "ro-does-not-exist"), json=reward, headers=AUTH).status_code == 404


async def test_terminal_rollout_is_409_even_right_after_it_finished(proxy, engine, client) -> None:
    rollout_id = await new_rollout(client)
    assert post_chat(proxy, rollout_id).status_code == 200  # the proxy now holds the rollout as running
    await client.update_status(rollout_id, rollout_pb2.ROLLOUT_STATE_SUCCEEDED)
    response = post_chat(proxy, rollout_id)
    assert response.status_code == 409 and response.json()["error"]["code"] == "rollout_terminal"
    before = engine_requests(engine)["requests"]
    assert post_chat(proxy, rollout_id).status_code == 409  # remembered: the engine is not called again
    assert engine_requests(engine)["requests"] == before
    reward = {"event_type": "reward", "data": {"value": 1}}
    assert httpx.post(event_url(proxy, rollout_id), json=reward, headers=AUTH).status_code == 409
    assert len(await recorded(client, rollout_id)) == 1


async def test_an_agents_reward_after_its_rollout_ended_is_409_and_not_stored(proxy, client) -> None:
    """Issue 17 #12 from the agent's side: the proxy still holds the rollout as running (its cache), so the refusal
    comes from the ledger, which takes no events for a finished rollout unless a writer opts in."""
    rollout_id = await new_rollout(client)
    token = {"authorization": f"Bearer {agent_token(KEY, rollout_id, 'at-1')}"}
    first = httpx.post(event_url(proxy, rollout_id), json={"event_type": "progress", "data": {"n": 1}}, headers=token)
    assert first.status_code == 200  # the proxy now holds the rollout as running
    await client.update_status(rollout_id, rollout_pb2.ROLLOUT_STATE_SUCCEEDED)
    late = httpx.post(event_url(proxy, rollout_id), json={"event_type": "reward", "data": {"value": 1}}, headers=token)
    assert late.status_code == 409, late.text
    error = late.json()["error"]
    assert error["code"] == "rollout_terminal" and rollout_id in error["message"] and "finished" in error["message"]
    assert [e.event_type for e in await recorded(client, rollout_id)] == ["progress"]


async def test_deleted_rollout_is_404_and_forgotten(proxy, engine, client) -> None:
    rollout_id = await new_rollout(client)
    assert post_chat(proxy, rollout_id).status_code == 200  # the proxy now holds the rollout as running
    await client.delete_rollouts([rollout_id])
    response = post_chat(proxy, rollout_id)  # still held as running: forwarded, then refused by the ledger
    assert response.status_code == 404 and response.json()["error"]["code"] == "rollout_not_found"
    before = engine_requests(engine)["requests"]
    assert post_chat(proxy, rollout_id).status_code == 404  # forgotten: checked again, before the engine
    assert engine_requests(engine)["requests"] == before


# -- agent events ------------------------------------------------------------------------------------------------


async def test_reward_is_ordered_after_the_calls_it_rewards(proxy, client) -> None:
    rollout_id = await new_rollout(client)
    async with openai.AsyncOpenAI(base_url=base_url(proxy, rollout_id), api_key=KEY, max_retries=0) as sdk:
        for _ in range(3):
            await sdk.chat.completions.create(**CHAT)
    async with httpx.AsyncClient(headers=AUTH) as http:
        bad = await http.post(
            event_url(proxy, rollout_id), json={"event_type": "reward", "data": {"reason": "no value"}}
        )
        assert bad.status_code == 422 and "value" in bad.json()["error"]["message"]
        note = await http.post(event_url(proxy, rollout_id), json={"event_type": "note", "data": {"k": [1, 2]}})
        reward = await http.post(
            event_url(proxy, rollout_id), json={"event_type": "reward", "data": {"value": 0.5, "source": "judge"}}
        )
    assert note.status_code == 200 and reward.status_code == 200
    events = await recorded(client, rollout_id)
    # The refused reward is stored as the proxy's warning (issue 15), not as a reward.
    assert [e.event_type for e in events] == ["model_request"] * 3 + ["proxy_refused_event", "note", "reward"]
    assert [e.sequence for e in events] == sorted(e.sequence for e in events)
    assert reward.json()["sequence"] == events[-1].sequence
    assert events[-1].reward.value == 0.5 and events[-1].reward.source == "judge"
    assert json.loads(events[4].data_json) == {"k": [1, 2]}


# -- disconnects -------------------------------------------------------------------------------------------------


async def test_client_disconnect_mid_stream_records_an_incomplete_event(proxy, engine, client) -> None:
    rollout_id = await new_rollout(client)
    aborted_before = engine_requests(engine)["streams_aborted"]
    body = {**CHAT, "stream": True, "standin": {"chunk_delay_ms": 300}}
    async with (
        httpx.AsyncClient(headers=AUTH) as http,
        http.stream("POST", f"{base_url(proxy, rollout_id)}/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if '"token_ids"' in line:
                break  # got the first content chunk: hang up
    events: list[event_pb2.Event] = []
    for _ in range(100):
        events = await recorded(client, rollout_id)
        if events:
            break
        await asyncio.sleep(0.05)
    (event,) = events
    call = event.model_request
    assert call.status == event_pb2.MODEL_REQUEST_STATUS_INCOMPLETE and call.stream
    assert 1 <= len(call.response_token_ids) < 5 and call.prompt_token_ids
    for _ in range(100):  # the proxy hung up on the engine too, so it stops generating
        if engine_requests(engine)["streams_aborted"] > aborted_before:
            break
        await asyncio.sleep(0.05)
    assert engine_requests(engine)["streams_aborted"] == aborted_before + 1


async def test_a_stream_request_answered_without_a_stream_is_an_error_event_and_recorded(proxy, client) -> None:
    """An engine (or a gateway before it) that ignores `stream` answers with one JSON body: the agent gets an SSE
    error, not a dropped connection, and the call is recorded as an error."""
    rollout_id = await new_rollout(client)
    body = {**CHAT, "stream": True, "standin": {"ignore_stream": True}}
    response = post_chat(proxy, rollout_id, body, timeout=10)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    (line,) = [line for line in response.text.splitlines() if line.startswith("data: ")]
    error = json.loads(line.removeprefix("data: "))["error"]
    assert "answered with application/json, not an event stream" in error["message"]
    (event,) = await recorded(client, rollout_id)
    call = event.model_request
    assert call.status == event_pb2.MODEL_REQUEST_STATUS_ERROR and call.stream and call.http_status == 200
    answered = json.loads(call.response_json)  # the engine's own body, as it came
    assert answered["object"] == "chat.completion" and answered["choices"][0]["message"]["content"]
