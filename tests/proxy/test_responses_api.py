"""The OpenAI Responses API through the proxy with the official `openai` SDK: answers parse (output_text, function
calls), a tool round trip with function_call_output items, streams as Responses events (also through the SDK's
stream helper, which checks their order), errors in OpenAI's shape, and every call recorded with the engine's
token ids and log-probs before the answer. Then the Codex CLI's shapes sent as Codex sends them: namespace, custom
and built-in tools, additional_tools items, custom and namespaced calls in the history and in answers (streamed
and not), the fields it sets that have no engine counterpart, and the 400s for shapes that cannot be served."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from services._gen.agl.v1 import event_pb2
from services.client import agent_token

from .conftest import KEY, MODEL, Http, base_url, engine_requests, new_rollout, set_engine
from .test_messages_api import assert_engine_tokens, recorded_calls

CALCULATOR = {
    "type": "function",
    "name": "calculator",
    "description": "Evaluates an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
}


def sdk(proxy: Http, rollout_id: str, **kwargs: Any) -> openai.OpenAI:
    url = base_url(proxy, rollout_id, mode=kwargs.pop("mode", "train"))
    return openai.OpenAI(base_url=url, api_key=kwargs.pop("api_key", KEY), max_retries=0)


async def test_text_answer_is_a_response_and_recorded_with_the_engines_tokens(
    proxy: Http, engine: Http, client
) -> None:
    rollout_id = await new_rollout(client)
    with sdk(proxy, rollout_id) as agent:
        response = agent.responses.create(
            model="gpt-5", instructions="Be terse.", input="What is 6 * 7?", max_output_tokens=64, store=False
        )
        (recorded,) = await recorded_calls(client, rollout_id)  # recorded before the answer
    assert response.object == "response" and response.status == "completed"
    assert response.output_text == "The answer is 42." and response.model == MODEL
    assert [item.type for item in response.output] == ["message"]
    assert response.usage is not None and response.usage.output_tokens == len(recorded.response_token_ids)
    assert response.usage.input_tokens == len(recorded.prompt_token_ids)
    assert_engine_tokens(recorded)
    assert recorded.api == "openai.responses" and not recorded.stream
    sent = engine_requests(engine)["received"][-1]
    assert sent["path"] == "/v1/chat/completions"
    assert sent["body"]["messages"] == [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "What is 6 * 7?"},
    ]
    assert sent["body"]["max_tokens"] == 64 and sent["body"]["return_token_ids"] is True
    assert json.loads(recorded.request_json) == sent["body"]


async def test_function_call_round_trip(proxy: Http, engine: Http, client) -> None:
    rollout_id = await new_rollout(client)
    question = [{"role": "user", "content": [{"type": "input_text", "text": "What is 6 * 7?"}]}]
    with sdk(proxy, rollout_id, api_key=agent_token(KEY, rollout_id, "at-1")) as agent:  # the agent's own token
        first = agent.responses.create(model="m", input=question, tools=[CALCULATOR])
        (call,) = first.output
        assert call.type == "function_call" and call.name == "calculator"
        assert json.loads(call.arguments) == {"expression": "6 * 7"}
        follow_up = [
            *question,
            {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id, "output": "42"},
        ]
        second = agent.responses.create(model="m", input=follow_up, tools=[CALCULATOR], tool_choice="auto")
    assert second.output_text == "The answer is 42."
    sent = engine_requests(engine)["received"][-1]["body"]
    assert sent["tools"][0]["function"]["name"] == "calculator" and sent["tool_choice"] == "auto"
    assistant, tool = sent["messages"][1:]
    assert assistant["role"] == "assistant" and assistant["tool_calls"][0]["id"] == call.call_id
    assert tool == {"role": "tool", "tool_call_id": call.call_id, "content": "42"}
    calls = await recorded_calls(client, rollout_id)
    assert len(calls) == 2 and calls[0].finish_reason == "tool_calls"
    for recorded in calls:
        assert_engine_tokens(recorded)


async def test_developer_turns_forced_tools_and_json_schema_are_translated(proxy: Http, engine: Http, client) -> None:
    rollout_id = await new_rollout(client)
    schema = {"type": "object", "properties": {"answer": {"type": "number"}}}
    with sdk(proxy, rollout_id, mode="val") as agent:  # train calls leave the constraints out (test_free_sampling)
        agent.responses.create(
            model="m",
            input=[{"role": "developer", "content": "Use tools."}, {"role": "user", "content": "What is 6 * 7?"}],
            tools=[CALCULATOR],
            tool_choice={"type": "function", "name": "calculator"},
            text={"format": {"type": "json_schema", "name": "result", "schema": schema, "strict": True}},
            temperature=0.2,
            top_p=0.9,
        )
        sent = engine_requests(engine)["received"][-1]["body"]
    with sdk(proxy, rollout_id) as agent:
        agent.responses.create(model="m", input="What is 6 * 7?", temperature=0.2, top_p=0.9)
        trained = engine_requests(engine)["received"][-1]["body"]
        cut = agent.responses.create(model="m", input="What is 6 * 7?", max_output_tokens=3)
    assert sent["messages"][0] == {"role": "system", "content": "Use tools."}
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "calculator"}}
    assert sent["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "result", "schema": schema, "strict": True},
    }
    # The proxy's train temperature and the whole distribution win over the agent's (train calls stay on-policy).
    assert trained["top_p"] == 1.0 and trained["temperature"] == 1.0
    assert cut.status == "incomplete" and cut.incomplete_details is not None
    assert cut.incomplete_details.reason == "max_output_tokens"


async def test_stream_arrives_as_responses_events_and_is_recorded_whole(proxy: Http, engine: Http, client) -> None:
    rollout_id = await new_rollout(client)
    agent = sdk(proxy, rollout_id)
    with agent, agent.responses.stream(model="m", input="What is 6 * 7?") as stream:
        deltas = [event.delta for event in stream if event.type == "response.output_text.delta"]
        final = stream.get_final_response()
    (recorded,) = await recorded_calls(client, rollout_id)
    assert len(deltas) > 3 and "".join(deltas) == "The answer is 42."
    assert final.output_text == "The answer is 42." and final.status == "completed"
    assert final.usage is not None and final.usage.output_tokens == len(recorded.response_token_ids)
    assert_engine_tokens(recorded)
    assert recorded.stream and recorded.api == "openai.responses"

    with sdk(proxy, rollout_id) as agent:
        events = list(agent.responses.create(model="m", input="What is 6 * 7?", stream=True))
    kinds = [event.type for event in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    added, done = events[2], events[-2]
    assert added.item.id == done.item.id == events[-1].response.output[0].id


async def test_streamed_function_call(proxy: Http, client) -> None:
    rollout_id = await new_rollout(client)
    agent = sdk(proxy, rollout_id)
    with agent, agent.responses.stream(model="m", input="What is 6 * 7?", tools=[CALCULATOR]) as stream:
        arguments = [event.delta for event in stream if event.type == "response.function_call_arguments.delta"]
        final = stream.get_final_response()
    (call,) = final.output
    assert call.type == "function_call" and call.name == "calculator" and call.status == "completed"
    assert json.loads(call.arguments) == {"expression": "6 * 7"} and "".join(arguments) == call.arguments
    (recorded,) = await recorded_calls(client, rollout_id)
    assert_engine_tokens(recorded)


async def test_errors_come_in_openais_shape(proxy: Http, engine: Http, client) -> None:
    rollout_id = await new_rollout(client)
    with sdk(proxy, rollout_id) as agent:
        with pytest.raises(openai.BadRequestError) as chained:
            agent.responses.create(model="m", input="hi", previous_response_id="resp_123")
        assert "was not made in this rollout attempt" in chained.value.body["message"]
        with pytest.raises(openai.BadRequestError) as unnamed:
            agent.responses.create(model="m", input="hi", tools=[{"type": "function"}])
        assert "tools[0] (function) needs `name`" in unnamed.value.body["message"]
        with pytest.raises(openai.BadRequestError) as empty:
            agent.responses.create(model="m", input=[])
        assert empty.value.body["code"] == "invalid_request"
        assert await recorded_calls(client, rollout_id) == []
        set_engine(engine, fail_next=1, fail_status=400)
        try:
            with pytest.raises(openai.BadRequestError) as refused:
                agent.responses.create(model="m", input="hi")
        finally:
            set_engine(engine, fail_next=0, fail_status=503)
    assert refused.value.body["message"] == "Engine temporarily failing."
    (recorded,) = await recorded_calls(client, rollout_id)
    assert recorded.status == event_pb2.MODEL_REQUEST_STATUS_ERROR and recorded.api == "openai.responses"
    with sdk(proxy, "ro-never-created") as agent, pytest.raises(openai.NotFoundError) as missing:
        agent.responses.create(model="m", input="hi")
    assert missing.value.body["code"] == "rollout_not_found"
    with sdk(proxy, rollout_id, api_key="wrong") as agent, pytest.raises(openai.AuthenticationError):
        agent.responses.create(model="m", input="hi")


async def test_a_cut_stream_ends_with_response_completed_marked_incomplete(proxy: Http, client) -> None:
    rollout_id = await new_rollout(client)
    agent = sdk(proxy, rollout_id)
    with agent, agent.responses.stream(model="m", input="What is 6 * 7?", max_output_tokens=3) as stream:
        final = stream.get_final_response()  # raises unless response.completed arrived
    assert final.status == "incomplete" and final.incomplete_details is not None
    assert final.incomplete_details.reason == "max_output_tokens"
    (recorded,) = await recorded_calls(client, rollout_id)
    assert len(recorded.response_token_ids) == 3 and recorded.finish_reason == "length"
    assert final.output_text == json.loads(recorded.response_json)["choices"][0]["message"]["content"]


# -- the Codex CLI's request shapes (sent as Codex sends them: raw JSON, not through the SDK) ------------------------

CALC_NAMESPACE = {
    "type": "namespace",
    "name": "mcp__calc__",
    "description": "Tools of the calc MCP server.",
    "tools": [{**CALCULATOR, "strict": False}],
}
EXEC = {
    "type": "custom",
    "name": "exec",
    "description": "Runs a script.",
    "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "run " /.+/'},
}
SHELL = {"type": "function", "name": "shell", "parameters": {"type": "object", "properties": {}}}
CODEX_FIELDS = {
    "model": "gpt-5.1-codex",
    "instructions": "You are Codex.",
    "reasoning": {"effort": "medium", "summary": "auto"},
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "0199c1d4-conversation",
    "client_metadata": {"session": "s-1"},
    "text": {"verbosity": "low"},
    "store": False,
    "parallel_tool_calls": False,
}


def codex_post(proxy: Http, rollout_id: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        f"{base_url(proxy, rollout_id)}/responses", json=body, headers={"authorization": f"Bearer {KEY}"}, timeout=30
    )


def sse_events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[len("data: ") :]) for line in text.splitlines() if line.startswith("data: ")]


async def test_codex_tools_reach_the_engine_as_functions_and_calls_come_back_namespaced(
    proxy: Http, engine: Http, client
) -> None:
    rollout_id = await new_rollout(client)
    opening = [
        {"type": "additional_tools", "role": "developer", "tools": [CALC_NAMESPACE]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is 6 * 7?"}]},
    ]
    tools = [{"type": "web_search", "external_web_access": False}, EXEC, SHELL]
    first = codex_post(proxy, rollout_id, {**CODEX_FIELDS, "input": opening, "tools": tools, "tool_choice": "auto"})
    assert first.status_code == 200, first.text
    sent = engine_requests(engine)["received"][-1]["body"]
    # The built-in left out; the custom tool a one-string function with its grammar described; the namespace's
    # function flattened; the additional_tools item's tools after the request's own.
    assert [tool["function"]["name"] for tool in sent["tools"]] == ["exec", "shell", "mcp__calc__calculator"]
    exec_function = sent["tools"][0]["function"]
    assert exec_function["parameters"]["required"] == ["input"]
    assert exec_function["description"].startswith("Runs a script.") and "lark" in exec_function["description"]
    assert 'start: "run " /.+/' in exec_function["description"]
    assert sent["messages"] == [
        {"role": "system", "content": "You are Codex."},
        {"role": "user", "content": "What is 6 * 7?"},
    ]
    for ignored in ("reasoning", "include", "prompt_cache_key", "client_metadata", "text", "store", "verbosity"):
        assert ignored not in sent
    (call,) = first.json()["output"]
    assert call["type"] == "function_call" and call["name"] == "calculator" and call["namespace"] == "mcp__calc__"
    assert json.loads(call["arguments"]) == {"expression": "6 * 7"}
    (recorded,) = await recorded_calls(client, rollout_id)
    assert list(recorded.warnings) == [
        "tools[0] is a built-in 'web_search' tool, which the engine cannot run: it was left out of the request."
    ]
    assert_engine_tokens(recorded)

    # The history comes back with a custom tool's call and output and the namespaced call: rendered for the engine
    # under the names it was offered.
    history = [
        *opening,
        {"type": "custom_tool_call", "call_id": "call_exec", "name": "exec", "input": "run ls", "status": "completed"},
        {"type": "custom_tool_call_output", "call_id": "call_exec", "output": "README.md"},
        {"type": "reasoning", "summary": [], "encrypted_content": None},
        {key: call[key] for key in ("type", "call_id", "name", "namespace", "arguments")},
        {"type": "function_call_output", "call_id": call["call_id"], "output": "42"},
    ]
    second = codex_post(proxy, rollout_id, {**CODEX_FIELDS, "input": history, "tools": tools})
    assert second.status_code == 200, second.text
    assert second.json()["output"][0]["content"][0]["text"] == "The answer is 42."
    sent = engine_requests(engine)["received"][-1]["body"]
    assert sent["messages"][2:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_exec",
                    "type": "function",
                    "function": {"name": "exec", "arguments": '{"input": "run ls"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_exec", "content": "README.md"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call["call_id"],
                    "type": "function",
                    "function": {"name": "mcp__calc__calculator", "arguments": call["arguments"]},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call["call_id"], "content": "42"},
    ]


async def test_a_custom_tools_call_comes_back_as_a_custom_tool_call_streamed_or_not(
    proxy: Http, engine: Http, client
) -> None:
    rollout_id = await new_rollout(client)
    calc = {"type": "custom", "name": "calc", "description": "Evaluates arithmetic.", "format": {"type": "text"}}
    body = {
        **CODEX_FIELDS,
        "input": "What is 6 * 7?",
        "tools": [calc],
        "tool_choice": {"type": "custom", "name": "calc"},
    }
    answer = codex_post(proxy, rollout_id, body)
    assert answer.status_code == 200, answer.text
    (call,) = answer.json()["output"]
    assert call["type"] == "custom_tool_call" and call["name"] == "calc" and call["input"] == "6 * 7"
    # A train call: the choice, translated to the function the engine is offered, is left out (test_free_sampling).
    assert engine_requests(engine)["received"][-1]["body"]["tool_choice"] == "auto"
    (recorded,) = await recorded_calls(client, rollout_id)
    assert "`tool_choice` (the named tool 'calc')" in recorded.warnings[0]

    streamed = codex_post(proxy, rollout_id, {**body, "stream": True})
    assert streamed.status_code == 200, streamed.text
    events = sse_events(streamed.text)
    kinds = [event["type"] for event in events]
    assert "response.function_call_arguments.delta" not in kinds
    added = next(event for event in events if event["type"] == "response.output_item.added")
    assert added["item"]["type"] == "custom_tool_call" and added["item"]["name"] == "calc"
    deltas = [event["delta"] for event in events if event["type"] == "response.custom_tool_call_input.delta"]
    (done,) = [event for event in events if event["type"] == "response.custom_tool_call_input.done"]
    assert "".join(deltas) == done["input"] == "6 * 7"
    item_done = next(event for event in events if event["type"] == "response.output_item.done")
    assert item_done["item"]["input"] == "6 * 7" and item_done["item"]["status"] == "completed"
    assert kinds[-1] == "response.completed"
    (final,) = events[-1]["response"]["output"]
    assert final["type"] == "custom_tool_call" and final["call_id"] == added["item"]["call_id"]

    namespaced = codex_post(
        proxy, rollout_id, {**CODEX_FIELDS, "input": "What is 6 * 7?", "tools": [CALC_NAMESPACE], "stream": True}
    )
    item_done = next(e for e in sse_events(namespaced.text) if e["type"] == "response.output_item.done")["item"]
    assert item_done["type"] == "function_call" and item_done["namespace"] == "mcp__calc__"
    assert item_done["name"] == "calculator" and json.loads(item_done["arguments"]) == {"expression": "6 * 7"}
    calls = await recorded_calls(client, rollout_id)
    # No warning but the train call's left-out choice: custom and namespace tools are offered, not dropped.
    assert len(calls) == 3 and all(w.startswith("`tool_choice`") for c in calls for w in c.warnings)
    for recorded in calls:
        assert_engine_tokens(recorded)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"tools": [{"type": "namespace", "name": "ns"}]}, "tools[0] (namespace) needs `tools`"),
        ({"tools": [{"type": "namespace", "name": "ns", "tools": [{"type": "web_search"}]}]}, "tools[0].tools[0]"),
        ({"tools": [{"type": "custom", "name": "x", "format": {"type": "grammar"}}]}, "tools[0].format (grammar)"),
        ({"tools": [{"type": "custom", "name": "x", "format": {"type": "regex"}}]}, "tools[0].format.type"),
        ({"tools": [EXEC, {**SHELL, "name": "exec"}]}, "tools[1] is offered to the engine as 'exec'"),
        ({"input": [{"type": "additional_tools", "tools": "none"}]}, "input[0] (additional_tools) needs `tools`"),
        ({"input": [{"type": "custom_tool_call", "call_id": "c", "name": "exec"}]}, "input[0] (custom_tool_call)"),
        ({"text": {"verbosity": "loud"}}, "`text.verbosity`"),
        ({"reasoning": "high"}, "`reasoning` must be an object"),
        ({"include": [1]}, "`include`"),
        ({"prompt_cache_key": 7}, "`prompt_cache_key`"),
        ({"client_metadata": []}, "`client_metadata`"),
    ],
)
async def test_bad_codex_shapes_get_a_400_naming_the_field(
    proxy: Http, client, change: dict[str, Any], named: str
) -> None:
    rollout_id = await new_rollout(client)
    answer = codex_post(proxy, rollout_id, {**CODEX_FIELDS, "input": "hi", **change})
    assert answer.status_code == 400
    assert named in answer.json()["error"]["message"]
    assert await recorded_calls(client, rollout_id) == []


async def test_only_built_in_tools_is_a_plain_call_with_a_warning(proxy: Http, engine: Http, client) -> None:
    rollout_id = await new_rollout(client)
    tools = [{"type": "web_search"}, {"type": "image_generation", "output_format": "png"}]
    answer = codex_post(proxy, rollout_id, {**CODEX_FIELDS, "input": "hi", "tools": tools, "tool_choice": "required"})
    assert answer.status_code == 200, answer.text
    sent = engine_requests(engine)["received"][-1]["body"]
    assert "tools" not in sent and "tool_choice" not in sent
    (recorded,) = await recorded_calls(client, rollout_id)
    assert [warning.split(" is ")[0] for warning in recorded.warnings] == ["tools[0]", "tools[1]"]
    assert "'image_generation'" in recorded.warnings[1]
