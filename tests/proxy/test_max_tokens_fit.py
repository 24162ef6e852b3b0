"""An output-token limit larger than the engine's context (Claude Code asks for 32,000 against a 512-position model)
is sent as the engine's max_model_len (read from its GET /v1/models), the engine grants what the prompt leaves,
and the call's record holds what was asked and what was granted; in chat completions, Messages and Responses
alike. The proxy's own abuse limit stays a 400. The stand-in engine speaks vLLM 0.32's rules: a limit above
max_model_len and a prompt longer than it are refused, other limits lowered to what the prompt leaves."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from services._gen.agl.v1 import event_pb2
from services.standin.model import render_chat
from services.standin.tokenizer import ToyTokenizer
from tests.support.procs import ServiceProcess

from .conftest import KEY, Http, base_url, engine_requests, new_rollout, register, run_standin
from .test_messages_api import assert_engine_tokens, recorded_calls

QUESTION = "What is 6 * 7?"
PROMPT_TOKENS = len(ToyTokenizer().encode(render_chat([{"role": "user", "content": QUESTION}], None)))
ROOM = 3  # what the question's prompt leaves: less than the answer ("The answer is 42.") needs
CONTEXT = PROMPT_TOKENS + ROOM
AUTH = {"authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def engine(ledger: ServiceProcess) -> Iterator[Http]:
    with run_standin(args=["--max-model-len", str(CONTEXT)]) as standin:
        register(ledger.address, standin)
        yield standin


def post(proxy: Http, rollout_id: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{base_url(proxy, rollout_id)}{path}", json=body, headers=AUTH, timeout=30)


def chat_body(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": QUESTION}], **fields}


def last_sent(engine: Http) -> dict[str, Any]:
    return engine_requests(engine)["received"][-1]["body"]


async def test_a_limit_above_the_context_is_sent_as_the_context_and_recorded(proxy: Http, engine: Http, client) -> None:
    rollout_id = await new_rollout(client)
    answer = post(proxy, rollout_id, "/chat/completions", chat_body(max_tokens=32_000))
    assert answer.status_code == 200, answer.text
    choice = answer.json()["choices"][0]
    assert choice["finish_reason"] == "length" and len(choice["token_ids"]) == ROOM
    assert last_sent(engine)["max_tokens"] == CONTEXT
    (recorded,) = await recorded_calls(client, rollout_id)
    assert recorded.requested_max_tokens == 32_000 and recorded.granted_max_tokens == ROOM
    assert json.loads(recorded.request_json)["max_tokens"] == CONTEXT  # the request as the engine got it
    assert len(recorded.prompt_token_ids) == PROMPT_TOKENS
    assert_engine_tokens(recorded)

    # max_completion_tokens (the newer spelling) too.
    again = post(proxy, rollout_id, "/chat/completions", chat_body(max_completion_tokens=64_000))
    assert again.status_code == 200, again.text
    assert last_sent(engine)["max_completion_tokens"] == CONTEXT
    second = (await recorded_calls(client, rollout_id))[1]
    assert (second.requested_max_tokens, second.granted_max_tokens) == (64_000, ROOM)


async def test_a_limit_within_the_context_is_sent_as_asked(proxy: Http, engine: Http, client) -> None:
    rollout_id = await new_rollout(client)
    more_than_left = post(proxy, rollout_id, "/chat/completions", chat_body(max_tokens=CONTEXT - 1))
    assert more_than_left.status_code == 200, more_than_left.text
    assert last_sent(engine)["max_tokens"] == CONTEXT - 1  # the engine lowers it itself
    fits = post(proxy, rollout_id, "/chat/completions", chat_body(max_tokens=2))
    assert fits.status_code == 200 and len(fits.json()["choices"][0]["token_ids"]) == 2
    lowered, untouched = await recorded_calls(client, rollout_id)
    assert (lowered.requested_max_tokens, lowered.granted_max_tokens) == (CONTEXT - 1, ROOM)
    assert (untouched.requested_max_tokens, untouched.granted_max_tokens) == (0, 0)
    assert not untouched.HasField("usage") or untouched.usage.prompt_tokens == PROMPT_TOKENS


async def test_the_proxys_own_limit_stays_a_400(proxy: Http, engine: Http, client) -> None:
    rollout_id = await new_rollout(client)
    before = len(engine_requests(engine)["received"])
    answer = post(proxy, rollout_id, "/chat/completions", chat_body(max_tokens=1_000_000))
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["code"] == "over_request_limit" and "`max_tokens` is 1000000" in error["message"]
    assert len(engine_requests(engine)["received"]) == before
    assert await recorded_calls(client, rollout_id) == []


async def test_messages_and_responses_fit_too(proxy: Http, engine: Http, client) -> None:
    rollout_id = await new_rollout(client)
    message = {"model": "claude-sonnet-4-5", "max_tokens": 32_000, "messages": [{"role": "user", "content": QUESTION}]}
    answer = post(proxy, rollout_id, "/messages", message)
    assert answer.status_code == 200, answer.text
    assert answer.json()["stop_reason"] == "max_tokens" and answer.json()["usage"]["output_tokens"] == ROOM
    assert last_sent(engine)["max_tokens"] == CONTEXT

    streamed = post(proxy, rollout_id, "/responses", {"model": "m", "input": QUESTION, "max_output_tokens": 64_000})
    assert streamed.status_code == 200, streamed.text
    assert streamed.json()["status"] == "incomplete" and streamed.json()["usage"]["output_tokens"] == ROOM
    assert last_sent(engine)["max_tokens"] == CONTEXT
    anthropic_call, responses_call = await recorded_calls(client, rollout_id)
    assert anthropic_call.api == "anthropic.messages" and responses_call.api == "openai.responses"
    assert (anthropic_call.requested_max_tokens, anthropic_call.granted_max_tokens) == (32_000, ROOM)
    assert (responses_call.requested_max_tokens, responses_call.granted_max_tokens) == (64_000, ROOM)


async def test_a_prompt_longer_than_the_context_is_the_engines_400_recorded_with_no_grant(
    proxy: Http, engine: Http, client
) -> None:
    rollout_id = await new_rollout(client)
    long = chat_body(max_tokens=32_000, messages=[{"role": "user", "content": "word " * CONTEXT}])
    answer = post(proxy, rollout_id, "/chat/completions", long)
    assert answer.status_code == 400
    assert "maximum context length" in answer.json()["error"]["message"]
    assert last_sent(engine)["max_tokens"] == CONTEXT
    (recorded,) = await recorded_calls(client, rollout_id)
    assert recorded.status == event_pb2.MODEL_REQUEST_STATUS_ERROR
    assert (recorded.requested_max_tokens, recorded.granted_max_tokens) == (32_000, 0)
