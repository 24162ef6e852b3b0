"""Train calls sample from the policy whatever the agent asks for: the core that leaves output constraints out, then
chat completions, Messages and Responses requests through the real proxy (a stand-in engine that records what it
receives): in train mode the engine's request holds no constraint and the call's warnings name each one left out;
validation calls keep them."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import openai

from services.proxy.call.free_sampling import free_sampling

from .conftest import AUTH, KEY, Http, base_url, engine_requests, new_rollout
from .test_messages_api import recorded_calls

STRICT_TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluates an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
        "strict": True,
    },
}
SCHEMA = {"type": "object", "properties": {"answer": {"type": "number"}}, "required": ["answer"]}
CONSTRAINED = {
    "tools": [STRICT_TOOL],
    "tool_choice": "required",
    "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": SCHEMA, "strict": True}},
    "guided_json": SCHEMA,
    "structured_outputs": {"regex": "[0-9]+"},
    "guided_decoding_backend": "xgrammar",
}
QUESTION = [{"role": "user", "content": "What is 6 * 7?"}]


def _unconstrained(sent: dict[str, Any]) -> None:
    assert sent.get("tool_choice", "auto") == "auto"
    assert all("strict" not in tool["function"] for tool in sent.get("tools", []))
    for name in ("response_format", "guided_json", "structured_outputs", "guided_decoding_backend"):
        assert name not in sent, name


# -- the core ---------------------------------------------------------------------------------------------------


def test_every_constraint_is_left_out_and_named() -> None:
    body = {"messages": QUESTION, **CONSTRAINED, "min_tokens": 4, "bad_words": ["x"]}
    out, warnings = free_sampling(body)
    _unconstrained(out)
    assert "min_tokens" not in out and "bad_words" not in out
    assert out["tools"][0]["function"]["name"] == "calculator" and out["messages"] == QUESTION
    assert body["tool_choice"] == "required" and body["tools"][0]["function"]["strict"] is True  # left as it was
    assert len(warnings) == 4
    assert "`strict` on tools calculator" in warnings[0]
    assert "`tool_choice` (required)" in warnings[1]
    assert "`response_format` (json_schema)" in warnings[2]
    assert "`structured_outputs`, `guided_json`, `bad_words`, `min_tokens` were" in warnings[3]


def test_a_free_request_is_the_same_object_and_no_warning() -> None:
    body = {
        "messages": QUESTION,
        "tools": [{"type": "function", "function": {"name": "f"}}],
        "tool_choice": "none",
        "response_format": {"type": "text"},
    }
    out, warnings = free_sampling(body)
    assert out is body and warnings == []
    named = {"type": "function", "function": {"name": "f"}}
    out, warnings = free_sampling({"prompt": "x", "tool_choice": named, "tools": [{"function": {"strict": False}}]})
    assert out["tool_choice"] == "auto" and "strict" not in out["tools"][0]["function"]
    assert len(warnings) == 1 and "the named tool 'f'" in warnings[0]  # strict: false constrains nothing


# -- through the proxy ------------------------------------------------------------------------------------------


async def test_strict_tools_and_required_choice_reach_the_engine_unconstrained_in_train_mode(
    proxy: Http, engine: Http, client
) -> None:
    rollout_id = await new_rollout(client)
    body = {"model": "m", "messages": QUESTION, **CONSTRAINED}
    answer = httpx.post(f"{base_url(proxy, rollout_id)}/chat/completions", json=body, headers=AUTH)
    assert answer.status_code == 200, answer.text
    sent = engine_requests(engine)["received"][-1]["body"]
    _unconstrained(sent)
    assert sent["tools"][0]["function"]["name"] == "calculator" and sent["logprobs"] is True
    (recorded,) = await recorded_calls(client, rollout_id)
    assert len(recorded.warnings) == 4
    assert "strict" in recorded.warnings[0] and "tool_choice" in recorded.warnings[1]
    assert "response_format" in recorded.warnings[2]
    assert "`structured_outputs`, `guided_json` were" in recorded.warnings[3]
    # The agent gets the engine's free answer in its API's shape (the toy model calls its calculator).
    assert answer.json()["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "calculator"

    # Validation keeps what the agent asked for: nothing is trained on it.
    answer = httpx.post(f"{base_url(proxy, rollout_id, mode='val')}/chat/completions", json=body, headers=AUTH)
    assert answer.status_code == 200, answer.text
    sent = engine_requests(engine)["received"][-1]["body"]
    assert sent["tool_choice"] == "required" and sent["tools"][0]["function"]["strict"] is True
    assert sent["response_format"]["type"] == "json_schema" and sent["guided_json"] == SCHEMA
    assert list((await recorded_calls(client, rollout_id))[1].warnings) == []


async def test_messages_and_responses_constraints_are_left_out_the_same_way(proxy: Http, engine: Http, client) -> None:
    rollout_id = await new_rollout(client)
    url = base_url(proxy, rollout_id)
    tool = STRICT_TOOL["function"]
    with anthropic.Anthropic(base_url=url.removesuffix("/v1"), api_key=KEY, max_retries=0) as agent:
        agent.messages.create(
            model="m",
            max_tokens=64,
            messages=QUESTION,
            tools=[{"name": tool["name"], "description": tool["description"], "input_schema": tool["parameters"]}],
            tool_choice={"type": "any"},
        )
    _unconstrained(engine_requests(engine)["received"][-1]["body"])
    with openai.OpenAI(base_url=url, api_key=KEY, max_retries=0) as agent:
        agent.responses.create(
            model="m",
            input="What is 6 * 7?",
            tools=[{"type": "function", **tool}],
            tool_choice={"type": "function", "name": "calculator"},
            text={"format": {"type": "json_schema", "name": "r", "schema": SCHEMA, "strict": True}},
        )
    _unconstrained(engine_requests(engine)["received"][-1]["body"])
    messages_call, responses_call = await recorded_calls(client, rollout_id)
    assert len(messages_call.warnings) == 1 and "`tool_choice` (required)" in messages_call.warnings[0]
    assert [warning.split(" ")[0] for warning in responses_call.warnings] == [
        "`strict`",
        "`tool_choice`",
        "`response_format`",
    ]
    assert "the named tool 'calculator'" in responses_call.warnings[1]
