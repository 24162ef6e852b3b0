"""Responses kept by the ledger, through the real proxy with the official `openai` SDK: `previous_response_id`
within a rollout attempt is served as the whole input would be (the engine gets the same chat request), chains over
several turns and from a streamed answer; `GET .../responses/{id}` answers from the record; a response of another
rollout is not found; `background` and `conversation` get a 400 naming them."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from .conftest import Http, engine_requests, new_rollout
from .test_messages_api import recorded_calls
from .test_responses_api import CALCULATOR, sdk

QUESTION = [{"role": "user", "content": "What is 6 * 7?"}]


def _sent(engine: Http) -> dict[str, Any]:
    return engine_requests(engine)["received"][-1]["body"]


async def test_a_chained_turn_reaches_the_engine_as_the_whole_input_would(proxy: Http, engine: Http, client) -> None:
    chained_rollout, whole_rollout = await new_rollout(client), await new_rollout(client)
    with sdk(proxy, chained_rollout) as agent:
        first = agent.responses.create(model="m", instructions="Be terse.", input=QUESTION, tools=[CALCULATOR])
        (call,) = first.output
        assert call.type == "function_call"
        output = {"type": "function_call_output", "call_id": call.call_id, "output": "42"}
        second = agent.responses.create(
            model="m", instructions="Be terse.", input=[output], tools=[CALCULATOR], previous_response_id=first.id
        )
        chained = _sent(engine)
        third = agent.responses.create(
            model="m", instructions="Be terse.", input="And 2 + 2?", tools=[CALCULATOR], previous_response_id=second.id
        )
        chained_again = _sent(engine)
    assert second.output_text == "The answer is 42." and second.previous_response_id == first.id
    assert third.previous_response_id == second.id

    # The same conversation sent whole, as an agent that keeps it itself does.
    with sdk(proxy, whole_rollout) as agent:
        history = [*QUESTION, {"type": "function_call", "call_id": call.call_id, "name": call.name,
                               "arguments": call.arguments}, output]  # fmt: skip
        agent.responses.create(model="m", instructions="Be terse.", input=history, tools=[CALCULATOR])
        whole = _sent(engine)
        history += [{"role": "assistant", "content": second.output_text}, {"role": "user", "content": "And 2 + 2?"}]
        agent.responses.create(model="m", instructions="Be terse.", input=history, tools=[CALCULATOR])
        whole_again = _sent(engine)
    assert chained["messages"] == whole["messages"]
    assert chained_again["messages"] == whole_again["messages"]
    assert chained_again["messages"][0] == {"role": "system", "content": "Be terse."}  # once, the new request's
    assert [m["role"] for m in chained_again["messages"]].count("system") == 1
    # Recorded as the chat requests the engine got: each holds the conversation before it, then its answer.
    calls = await recorded_calls(client, chained_rollout)
    recorded = [json.loads(c.request_json)["messages"] for c in calls[1:]]
    assert recorded == [chained["messages"], chained_again["messages"]]
    first_sent = json.loads(calls[0].request_json)["messages"]
    assert chained["messages"][: len(first_sent)] == first_sent
    assert chained["messages"][len(first_sent)]["tool_calls"][0]["id"] == call.call_id


async def test_new_instructions_replace_the_earlier_ones_and_a_streamed_answer_chains(
    proxy: Http, engine: Http, client
) -> None:
    rollout_id = await new_rollout(client)
    with sdk(proxy, rollout_id) as agent:
        with agent.responses.stream(model="m", instructions="Be terse.", input="What is 6 * 7?") as stream:
            first = stream.get_final_response()
        agent.responses.create(model="m", instructions="Be kind.", input="Thanks!", previous_response_id=first.id)
    assert _sent(engine)["messages"] == [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "What is 6 * 7?"},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "Thanks!"},
    ]


async def test_get_answers_a_response_from_the_ledger_and_only_in_its_rollout(proxy: Http, client) -> None:
    rollout_id, other = await new_rollout(client), await new_rollout(client)
    with sdk(proxy, rollout_id) as agent:
        made = agent.responses.create(model="m", input=QUESTION, tools=[CALCULATOR], max_output_tokens=64)
        fetched = agent.responses.retrieve(made.id)
        with pytest.raises(openai.NotFoundError) as unknown:
            agent.responses.retrieve("resp_unknown")
    assert fetched.id == made.id and fetched.status == "completed" and fetched.max_output_tokens == 64
    assert [(item.type, item.name, json.loads(item.arguments)) for item in fetched.output] == [
        (item.type, item.name, json.loads(item.arguments)) for item in made.output
    ]
    assert fetched.usage is not None and made.usage is not None
    assert fetched.usage.output_tokens == made.usage.output_tokens
    assert "was not made in this rollout attempt" in unknown.value.body["message"]
    with sdk(proxy, other) as agent:
        with pytest.raises(openai.NotFoundError):
            agent.responses.retrieve(made.id)
        with pytest.raises(openai.BadRequestError) as elsewhere:
            agent.responses.create(model="m", input="hi", previous_response_id=made.id)
    message = elsewhere.value.body["message"]
    assert message.startswith(f"`previous_response_id`: Response '{made.id}' was not made in this rollout attempt")
    assert await recorded_calls(client, other) == []


@pytest.mark.parametrize(
    ("field", "value"), [("background", True), ("conversation", "conv_1"), ("conversation", {"id": "conv_1"})]
)
async def test_background_and_conversation_get_a_400_naming_them(proxy: Http, client, field: str, value: Any) -> None:
    rollout_id = await new_rollout(client)
    with sdk(proxy, rollout_id) as agent, pytest.raises(openai.BadRequestError) as refused:
        agent.responses.create(model="m", input="hi", extra_body={field: value})
    assert f"`{field}" in refused.value.body["message"] and "not supported" in refused.value.body["message"]
    assert await recorded_calls(client, rollout_id) == []
