"""A tool call the agent sends back re-serialised is the call the model sampled: the next prompt continues the sampled
tokens (the proxy's token continuation, against a stand-in engine serving vLLM's split chat path); a call the agent
really changed is a break, counted as `diverged`.

The stand-in model writes the call's JSON as asked (compact, or with non-ASCII escaped), its parser hands the
arguments back re-serialised as vLLM's Hermes parser does, and its template writes an assistant turn's calls back
from the parsed arguments, as vLLM and Hermes templates do: the rendered text then differs from the sampled text
exactly where a real engine's does.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from services._gen.agl.v1 import event_pb2
from services.client import LedgerClient
from tests.support.procs import ServiceProcess

from .conftest import AUTH, KEY, Http, base_url, new_rollout, register, run_standin

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluates an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
    },
}
ARITHMETIC = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Applies an arithmetic operator to two numbers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}, "op": {"type": "string"}},
        },
    },
}
QUESTION = {"role": "user", "content": "What is 2 + 3?"}
HEADERS = {"authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def engine(ledger: ServiceProcess) -> Iterator[Http]:
    with run_standin(args=["--scale-out"]) as standin:
        register(ledger.address, standin)
        yield standin


def _counter(proxy: Http, outcome: str) -> float:
    prefix = f'agl_proxy_token_continuations_total{{outcome="{outcome}"}} '
    lines = httpx.get(f"{proxy.url}/metrics", headers=AUTH).text.splitlines()
    return sum(float(line[len(prefix) :]) for line in lines if line.startswith(prefix))


async def _calls(client: LedgerClient, rollout_id: str) -> list[event_pb2.ModelRequest]:
    return [e.model_request for e in await client.list_events(rollout_id, event_type="model_request")]


async def _round_trip(
    proxy: Http, client: LedgerClient, tool: dict[str, Any], knobs: dict[str, Any], sent_back: Callable[[str], str]
) -> tuple[list[event_pb2.ModelRequest], dict[str, Any], dict[str, Any]]:
    """A tool call, then the call sent back with its arguments as `sent_back` writes them and the tool's result.
    Returns the recorded calls, the call the agent got and the second answer."""
    rollout_id = await new_rollout(client)
    url = f"{base_url(proxy, rollout_id)}/chat/completions"
    async with httpx.AsyncClient(headers=HEADERS, timeout=30) as http:
        first = await http.post(url, json={"model": "m", "messages": [QUESTION], "tools": [tool], "standin": knobs})
        assert first.status_code == 200, first.text
        (call,) = first.json()["choices"][0]["message"]["tool_calls"]
        function = {"name": call["function"]["name"], "arguments": sent_back(call["function"]["arguments"])}
        history = [
            QUESTION,
            {"role": "assistant", "content": None, "tool_calls": [{"id": call["id"], "type": "function",
                                                                   "function": function}]},
            {"role": "tool", "tool_call_id": call["id"], "content": "5"},
        ]  # fmt: skip
        second = await http.post(url, json={"model": "m", "messages": history, "tools": [tool]})
        assert second.status_code == 200, second.text
    return await _calls(client, rollout_id), call, second.json()


def _continues(calls: list[event_pb2.ModelRequest]) -> bool:
    first, second = calls
    sampled = [*first.prompt_token_ids, *first.response_token_ids]
    return list(second.prompt_token_ids[: len(sampled)]) == sampled


def _compact(arguments: str) -> str:
    return json.dumps(json.loads(arguments), separators=(",", ":"))


def _reordered_as_javascript(arguments: str) -> str:
    """Keys reversed, and 2.0 written as 2, as JSON.stringify writes a parsed number."""
    parsed = json.loads(arguments)
    written = {k: int(v) if isinstance(v, float) and v.is_integer() else v for k, v in reversed(parsed.items())}
    return json.dumps(written, separators=(",", ":"))


def _escaped(arguments: str) -> str:
    return json.dumps(json.loads(arguments))  # non-ASCII as \\u escapes


@pytest.mark.parametrize(
    ("tool", "knobs", "sent_back", "sampled_spelling"),
    [
        # The model wrote compact JSON; the agent sends back what the parser gave it (spaced), which vLLM re-renders.
        (CALCULATOR, {"tool_json": "compact"}, lambda args: args, '{"expression":"2 + 3"}'),
        (CALCULATOR, {"tool_json": "compact"}, _compact, '{"expression":"2 + 3"}'),
        # The model wrote 2.0 and keys a, b, op; the agent (a JavaScript harness) writes them back reordered, as 2.
        (ARITHMETIC, {}, _reordered_as_javascript, '{"a": 2.0, "b": 3.0, "op": "+"}'),
        # The model escaped non-ASCII (json.dumps's default); the agent sends it back escaped or not.
        (CALCULATOR, {"tool_arguments": {"expression": "2 + 3", "note": "caf\u00e9 \u00d7"}}, _escaped, "caf\\u00e9"),
        (CALCULATOR, {"tool_arguments": {"expression": "2 + 3", "note": "caf\u00e9 \u00d7"}}, lambda a: a, "\\u00d7"),
    ],
    ids=["compact-sampled", "compact-sent", "reordered-keys-and-numbers", "unicode-escaped", "unicode-sent-raw"],
)
async def test_a_re_serialised_tool_call_continues_the_sampled_tokens(
    proxy: Http, engine: Http, client: LedgerClient, tool, knobs, sent_back, sampled_spelling
) -> None:
    spliced, diverged = _counter(proxy, "spliced"), _counter(proxy, "diverged")
    calls, _, answer = await _round_trip(proxy, client, tool, knobs, sent_back)
    first = json.loads(calls[0].response_json)["choices"][0]
    assert first["finish_reason"] == "tool_calls"
    sampled_text = httpx.post(f"{engine.url}/detokenize", json={"tokens": list(calls[0].response_token_ids)}).json()
    assert sampled_spelling in sampled_text["prompt"]  # the model's own spelling, not the one sent back
    assert answer["choices"][0]["message"]["content"] == "The answer is 5."
    assert _continues(calls), "the second prompt does not continue the sampled tokens"
    assert _counter(proxy, "spliced") == spliced + 1 and _counter(proxy, "diverged") == diverged
    assert calls[1].status == event_pb2.MODEL_REQUEST_STATUS_OK and calls[1].response_token_ids


async def test_an_edited_tool_call_is_a_counted_break(proxy: Http, engine: Http, client: LedgerClient) -> None:
    spliced, diverged = _counter(proxy, "spliced"), _counter(proxy, "diverged")
    edited = '{"expression": "2 + 4"}'
    calls, _, answer = await _round_trip(proxy, client, CALCULATOR, {"tool_json": "compact"}, lambda _: edited)
    assert answer["choices"][0]["message"]["content"] == "The answer is 5."
    assert not _continues(calls)
    assert _counter(proxy, "diverged") == diverged + 1 and _counter(proxy, "spliced") == spliced
    # Sent as the agent wrote it: the engine rendered the edited call.
    assert '"2 + 4"' in json.loads(calls[1].request_json)["messages"][1]["tool_calls"][0]["function"]["arguments"]


async def test_anthropic_tool_use_input_sent_back_by_a_javascript_harness_continues(
    proxy: Http, engine: Http, client: LedgerClient
) -> None:
    """The Messages API: the proxy itself writes `tool_use.input` back as arguments (compact), from what a
    JavaScript harness parsed (2.0 became 2)."""
    rollout_id = await new_rollout(client)
    url = f"{base_url(proxy, rollout_id)}/messages"
    tool = {"name": "calculator", "description": "Applies an operator.",
            "input_schema": ARITHMETIC["function"]["parameters"]}  # fmt: skip
    question = {"role": "user", "content": "What is 2 + 3?"}
    spliced = _counter(proxy, "spliced")
    async with httpx.AsyncClient(headers={"x-api-key": KEY}, timeout=30) as http:
        first = await http.post(url, json={"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": [question],
                                           "tools": [tool]})  # fmt: skip
        assert first.status_code == 200, first.text
        (use,) = first.json()["content"]
        assert use["input"] == {"a": 2.0, "b": 3.0, "op": "+"}
        written = {"op": "+", "b": 3, "a": 2}
        turns = [
            question,
            {"role": "assistant", "content": [{"type": "tool_use", "id": use["id"], "name": use["name"],
                                               "input": written}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": "5"}]},
        ]  # fmt: skip
        second = await http.post(url, json={"model": "claude-haiku-4-5", "max_tokens": 64, "messages": turns,
                                            "tools": [tool]})  # fmt: skip
        assert second.status_code == 200, second.text
    assert second.json()["content"] == [{"type": "text", "text": "The answer is 5."}]
    assert _continues(await _calls(client, rollout_id))
    assert _counter(proxy, "spliced") == spliced + 1
