"""The console's transcript (pure): new messages only per call, tool calls and results, completions, rewards."""

from __future__ import annotations

import json

from services._gen.agl.v1 import event_pb2
from services.console.transcript import reward_of, transcript


def model_call(request: dict, response: dict, api: str = "chat.completions") -> event_pb2.Event:
    event = event_pb2.Event(rollout_id="r", event_type="model_request")
    event.model_request.request_json = json.dumps(request)
    event.model_request.response_json = json.dumps(response)
    event.model_request.api = api
    event.model_request.prompt_token_ids.extend([1, 2])
    return event


def test_tool_calls_results_and_only_new_messages():
    user = {"role": "user", "content": [{"type": "text", "text": "Add 2 and 2"}]}
    asks = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "function": {"name": "add", "arguments": '{"a": 2, "b": 2}'}}],
    }
    result = {"role": "tool", "tool_call_id": "c1", "content": "4"}
    events = [
        model_call({"messages": [user]}, {"choices": [{"message": asks}]}),
        model_call(
            {"messages": [user, asks, result]}, {"choices": [{"message": {"role": "assistant", "content": "4"}}]}
        ),
        event_pb2.Event(rollout_id="r", reward=event_pb2.Reward(value=1.0, source="judge", reason="exact")),
        event_pb2.Event(rollout_id="r", event_type="note", data_json='{"x": 1}'),
        model_call({"prompt": "2+2="}, {"choices": [{"text": "4"}]}, api="completions"),
    ]
    items = transcript(events)
    assert [i.kind for i in items] == ["call", "call", "reward", "event", "call"]
    first, second = items[0].call, items[1].call
    assert [(m.role, m.content) for m in first.messages] == [("user", "Add 2 and 2"), ("assistant", "")]
    assert first.messages[1].tool_calls == [("c1", "add", '{"a": 2, "b": 2}')]
    # The second call shows the tool result and the answer, not the user turn again.
    assert [(m.role, m.tool_call_id, m.content) for m in second.messages] == [
        ("tool", "c1", "4"),
        ("assistant", "", "4"),
    ]
    assert second.prompt_tokens == 2 and second.logprobs is None
    assert (items[2].value, items[2].detail) == (1.0, "judge, exact")
    assert (items[3].event_type, items[3].detail) == ("note", '{"x": 1}')
    assert [(m.role, m.content) for m in items[4].call.messages] == [("prompt", "2+2="), ("assistant", "4")]
    assert reward_of(events) == 1.0


def test_malformed_json_does_not_break_the_page():
    event = event_pb2.Event(rollout_id="r", event_type="model_request")
    event.model_request.request_json = "{not json"
    event.model_request.response_json = '{"error": "engine down"}'
    [item] = transcript([event])
    assert [(m.role, m.content) for m in item.call.messages] == [("error", '{"error": "engine down"}')]
