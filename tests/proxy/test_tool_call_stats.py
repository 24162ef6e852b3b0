"""What the proxy records of a response's tool calls (the core), and the error an agent offering tools gets from an
engine started without a tool-call parser (through the real proxy, a stand-in answering as vLLM does)."""

from __future__ import annotations

import json

import httpx

from services.proxy.call.tool_calls import missing_parser_message, offered_tool_names, tool_call_stats

from .conftest import AUTH, MODEL, Http, base_url, new_rollout

TOOL = {"type": "function", "function": {"name": "calculator", "parameters": {"type": "object", "properties": {}}}}
# vLLM 0.32's answer to a request with tools when it runs without --enable-auto-tool-choice/--tool-call-parser.
VLLM_NO_PARSER = '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'


def _call(name: object, arguments: object) -> dict[str, object]:
    return {"id": "c", "type": "function", "function": {"name": name, "arguments": arguments}}


def test_stats_count_parsed_unparsed_unknown_and_invalid_calls() -> None:
    offered = offered_tool_names({"tools": [TOOL, {"type": "function", "function": {"name": "search"}}]})
    assert offered == frozenset({"calculator", "search"})
    calls = [
        _call("calculator", '{"expression": "1 + 1"}'),
        _call("", "{}"),  # an empty name: the failure that scores every rollout 0
        _call("weather", '{"city": "Oslo"}'),
        _call("search", "not json"),
        _call("search", "[1, 2]"),  # JSON, but not an object
    ]
    text = 'Let me see. <tool_call>{"name": "calculator", "arguments": {"expression": 2 *}}</tool_call>'
    assert tool_call_stats(offered, text, calls) == {
        "offered_tools": 2,
        "parsed_calls": 5,
        "unparsed_calls": 1,
        "unknown_tool_calls": 2,
        "invalid_argument_calls": 2,
    }
    # Nothing offered and nothing called: nothing to count. Offered but unused: zeros.
    assert tool_call_stats(None, "The answer is 2.", []) is None
    assert tool_call_stats(offered, "The answer is 2.", [])["parsed_calls"] == 0
    assert offered_tool_names({"tools": []}) is None and offered_tool_names({}) is None


def test_missing_parser_message_only_for_the_engines_parser_refusal() -> None:
    body = json.dumps({"error": {"message": VLLM_NO_PARSER, "type": "BadRequestError"}}).encode()
    message = missing_parser_message(400, body)
    assert message is not None and "--tool-call-parser hermes" in message and "AGL_ENGINE_TOOL_CALL_PARSER" in message
    assert VLLM_NO_PARSER in message
    assert missing_parser_message(400, b'{"error": {"message": "max_tokens is too large"}}') is None
    assert missing_parser_message(500, body) is None


async def test_an_agent_offering_tools_to_an_engine_without_a_parser_is_told_the_flag(proxy: Http, client) -> None:
    rollout_id = await new_rollout(client)
    url = f"{base_url(proxy, rollout_id)}/chat/completions"
    refusal = {"status": 400, "message": VLLM_NO_PARSER}
    body = {"model": MODEL, "messages": [{"role": "user", "content": "What is 2 * 3?"}], "standin": refusal}
    reply = httpx.post(url, json={**body, "tools": [TOOL]}, headers=AUTH, timeout=30)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["code"] == "engine_has_no_tool_parser"
    assert "agl-engine --tool-call-parser hermes" in error["message"] and VLLM_NO_PARSER in error["message"]
    # The call is still recorded (as the engine's error), like every failed call.
    events = await client.list_events(rollout_id, attempt_id="*", event_type="model_request")
    assert [e.model_request.http_status for e in events] == [400]
    # Without tools the engine's own 400 reaches the agent as it was.
    plain = httpx.post(url, json=body, headers=AUTH, timeout=30)
    assert plain.status_code == 400 and plain.json()["error"].get("code") != "engine_has_no_tool_parser"
