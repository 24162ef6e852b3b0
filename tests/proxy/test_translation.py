"""The translations of the Messages and Responses APIs to and from chat completions, called directly (pure core):
the shapes the stand-in engine never produces (reasoning, matched stop strings, images, refused blocks)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from services.proxy.dialects import anthropic_messages, openai_responses, responses_tools
from services.proxy.errors import ProxyError


def events(stream: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in stream.decode().split("\n\n"):
        if block:
            name, data = block.split("\n")
            out.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        **extra,
    }


def test_messages_request_blocks_become_chat_messages() -> None:
    chat = anthropic_messages.to_chat(
        {
            "max_tokens": 10,
            "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What is this?"},
                        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
                    ],
                },
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "hmm", "signature": "x"},
                        {"type": "text", "text": "Let me look."},
                        {"type": "tool_use", "id": "t1", "name": "zoom", "input": {"level": 2}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "a cat"}]},
                        {"type": "tool_result", "tool_use_id": "t2", "is_error": True},
                        {"type": "text", "text": "And now?"},
                    ],
                },
            ],
            "tool_choice": {"type": "any"},
            "top_k": 5,
            "metadata": {"user_id": "u"},
        }
    )
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief.\nBe kind."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            ],
        },
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "zoom", "arguments": '{"level":2}'}}],
            "reasoning": "hmm",  # the thinking block, for a template that writes past reasoning back
        },
        {"role": "tool", "tool_call_id": "t1", "content": "a cat"},
        {"role": "tool", "tool_call_id": "t2", "content": "error"},
        {"role": "user", "content": "And now?"},
    ]
    assert chat["tool_choice"] == "required" and chat["top_k"] == 5 and "metadata" not in chat
    assert "stream" not in chat


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        ({"max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
        ({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "document"}]}]}, "'document'"),
        (
            {"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "some"}},
            "tool_choice",
        ),
        ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "stream": "yes"}, "stream"),
    ],
)
def test_messages_requests_that_cannot_be_translated_name_the_problem(body: dict[str, Any], named: str) -> None:
    with pytest.raises(ProxyError) as refused:
        anthropic_messages.to_chat(body)
    assert refused.value.status == 400 and named in refused.value.message


def test_messages_answer_keeps_reasoning_and_the_matched_stop_sequence() -> None:
    response = {
        "id": "chatcmpl-abc",
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "4", "reasoning_content": "2+2"},
                "finish_reason": "stop",
                "stop_reason": "END",
            }
        ],
        "usage": {"prompt_tokens": 7, "completion_tokens": 3},
    }
    message = anthropic_messages.from_chat(response, {"stop_sequences": ["END"]})
    assert message["id"] == "msg_abc"
    assert message["content"] == [
        {"type": "thinking", "thinking": "2+2", "signature": ""},
        {"type": "text", "text": "4"},
    ]
    assert (message["stop_reason"], message["stop_sequence"]) == ("stop_sequence", "END")
    assert message["usage"] == {"input_tokens": 7, "output_tokens": 3}
    forced = {
        "choices": [
            {
                "message": {"tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{"}}]},
                "finish_reason": "stop",
            }
        ]
    }
    answer = anthropic_messages.from_chat(forced, {})
    assert answer["stop_reason"] == "tool_use"  # a named tool choice finishes with "stop" in vLLM
    assert answer["content"] == [{"type": "tool_use", "id": "c", "name": "f", "input": {}}]  # unparsable arguments


def test_messages_stream_opens_and_closes_blocks_in_order() -> None:
    stream = anthropic_messages.MessagesStream({})
    out = stream.feed(chunk({"role": "assistant", "content": ""}, prompt_token_ids=[1, 2, 3]))
    out += stream.feed(chunk({"reasoning_content": "think"}))
    out += stream.feed(chunk({"content": "Hi"}))
    out += stream.feed(chunk({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "f", "arguments": ""}}]}))
    out += stream.feed(chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"a": 1}'}}]}, "tool_calls"))
    out += stream.feed({"id": "chatcmpl-1", "choices": [], "usage": {"completion_tokens": 9}})
    out += stream.finish({"choices": [{"index": 0, "finish_reason": "tool_calls"}], "usage": {"completion_tokens": 9}})
    seen = events(out)
    assert [(name, data.get("index")) for name, data in seen] == [
        ("message_start", None),
        ("content_block_start", 0),
        ("content_block_delta", 0),
        ("content_block_stop", 0),
        ("content_block_start", 1),
        ("content_block_delta", 1),
        ("content_block_stop", 1),
        ("content_block_start", 2),
        ("content_block_delta", 2),
        ("content_block_stop", 2),
        ("message_delta", None),
        ("message_stop", None),
    ]
    assert seen[0][1]["message"]["usage"]["input_tokens"] == 3
    assert seen[2][1]["delta"] == {"type": "thinking_delta", "thinking": "think"}
    assert seen[7][1]["content_block"] == {"type": "tool_use", "id": "c1", "name": "f", "input": {}}
    assert seen[8][1]["delta"] == {"type": "input_json_delta", "partial_json": '{"a": 1}'}
    assert seen[10][1]["delta"]["stop_reason"] == "tool_use" and seen[10][1]["usage"] == {
        "input_tokens": 0,
        "output_tokens": 9,
    }


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (404, "not_found_error"),
        (413, "request_too_large"),
        (429, "rate_limit_error"),
        (502, "api_error"),
        (503, "overloaded_error"),
        (504, "timeout_error"),
    ],
)
def test_anthropic_error_types_by_status(status: int, kind: str) -> None:
    body = anthropic_messages.error_body({"error": {"message": "m", "type": "x", "code": "y"}}, status)
    assert body == {"type": "error", "error": {"type": kind, "message": "m"}}


def test_responses_items_become_chat_messages() -> None:
    chat = openai_responses.to_chat(
        {
            "instructions": "Sys.",
            "input": [
                {
                    "type": "message",
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "Look: "},
                        {"type": "input_image", "image_url": "http://x/i.png"},
                    ],
                },
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {"role": "assistant", "content": [{"type": "output_text", "text": "Calling."}]},
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "one"},
                {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "two"}]},
            ],
            "text": {"format": {"type": "json_object"}},
            "parallel_tool_calls": False,
            "stream": True,
        }
    )
    assert chat["messages"] == [
        {"role": "system", "content": "Sys."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Look: "},
                {"type": "image_url", "image_url": {"url": "http://x/i.png"}},
            ],
        },
        {
            "role": "assistant",
            "content": "Calling.",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "one"},
        {"role": "tool", "tool_call_id": "c2", "content": "two"},
    ]
    assert chat["response_format"] == {"type": "json_object"} and chat["parallel_tool_calls"] is False
    assert chat["stream"] is True and chat["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"input": "x", "previous_response_id": 7}, "`previous_response_id` must be a string"),
        ({"input": "x", "background": True}, "`background: true` is not supported"),
        ({"input": "x", "conversation": "conv_1"}, "`conversation` is not supported"),
        ({"input": "x", "conversation": {"id": "conv_1"}}, "`conversation` is not supported"),
        ({"input": [{"type": "computer_call"}]}, "'computer_call'"),
        ({"input": "x", "tools": [{"type": "function"}]}, "tools[0] (function) needs `name`"),
        ({"input": "x", "tools": [{"name": "f"}]}, "tools[0] needs `type`"),
        ({"input": "x", "tool_choice": "sometimes"}, "tool_choice"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "'input_file'"),
    ],
)
def test_responses_requests_that_cannot_be_translated_name_the_problem(body: dict[str, Any], named: str) -> None:
    with pytest.raises(ProxyError) as refused:
        openai_responses.to_chat(body)
    assert refused.value.status == 400 and named in refused.value.message


def test_responses_built_in_tools_are_left_out_with_a_warning() -> None:
    body = {
        "input": "x",
        "tools": [{"type": "file_search", "vector_store_ids": ["v"]}, {"type": "function", "name": "f"}],
    }
    chat = openai_responses.to_chat(body)
    assert [tool["function"]["name"] for tool in chat["tools"]] == ["f"]
    assert openai_responses.warnings(body) == [
        "tools[0] is a built-in 'file_search' tool, which the engine cannot run: it was left out of the request."
    ]
    assert openai_responses.warnings({"input": "x", "tools": [{"type": "function", "name": "f"}]}) == []


def test_flat_names_and_custom_inputs() -> None:
    assert responses_tools.flat_name(None, "shell") == "shell"
    assert responses_tools.flat_name("collab", "send") == "collab__send"
    assert responses_tools.flat_name("mcp__docs__", "search") == "mcp__docs__search"  # no doubled separator
    assert responses_tools.flat_name("my.server", "get page") == "my_server__get_page"  # the allowed characters
    assert responses_tools.custom_input('{"input": "run ls"}') == "run ls"
    assert responses_tools.custom_input('"run ls"') == "run ls"  # a bare JSON string
    assert responses_tools.custom_input("run ls") == "run ls"  # not JSON: what the model wrote
    assert responses_tools.custom_input('{"script": 1}') == '{"script": 1}'
    assert responses_tools.custom_input("") == ""
    table = responses_tools.tool_table({"tools": [{"type": "custom", "name": "exec"}]})
    item = table.output_item("c1", "exec", '{"input": "ls"}')
    assert item["type"] == "custom_tool_call" and item["input"] == "ls" and "namespace" not in item
    again = {"type": "additional_tools", "tools": [{"type": "custom", "name": "exec"}]}
    assert len(responses_tools.tool_table({"tools": [{"type": "custom", "name": "exec"}], "input": [again]}).tools) == 1
    unknown = table.output_item("c2", "nope", "{}")
    assert unknown["type"] == "function_call" and unknown["name"] == "nope"


def test_responses_answer_with_reasoning_and_a_call() -> None:
    response = {
        "id": "chatcmpl-9",
        "created": 5,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {
                    "reasoning": "plan",
                    "content": None,
                    "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 4, "completion_tokens": 6, "total_tokens": 10},
    }
    body = openai_responses.from_chat(response, {"tools": [{"type": "function", "name": "f"}]})
    assert body["id"] == "resp_9" and body["created_at"] == 5 and body["status"] == "completed"
    assert [item["type"] for item in body["output"]] == ["reasoning", "function_call"]
    assert body["output"][0]["content"] == [{"type": "reasoning_text", "text": "plan"}]
    assert body["output"][1]["call_id"] == "c" and body["output"][1]["name"] == "f"
    assert body["usage"]["total_tokens"] == 10 and body["tools"] == [{"type": "function", "name": "f"}]


def test_responses_stream_numbers_every_event_and_reuses_item_ids() -> None:
    stream = openai_responses.ResponsesStream({})
    out = stream.feed(chunk({"role": "assistant", "content": ""}))
    out += stream.feed(chunk({"reasoning_content": "plan"}))
    out += stream.feed(chunk({"content": "Hi"}))
    out += stream.feed(chunk({"content": "!"}, "length"))
    out += stream.finish(
        {"choices": [{"index": 0, "finish_reason": "length"}], "usage": {"prompt_tokens": 1, "completion_tokens": 3}}
    )
    seen = events(out)
    assert [data["sequence_number"] for _, data in seen] == list(range(len(seen)))
    assert [name for name, _ in seen] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",  # also for a cut answer, as vLLM does: the SDKs' stream helpers wait for it
    ]
    final = seen[-1][1]["response"]
    assert final["status"] == "incomplete" and final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert [item["id"] for item in final["output"]] == [seen[2][1]["item"]["id"], seen[6][1]["item"]["id"]]
    assert final["output"][1]["content"][0]["text"] == "Hi!" and final["usage"]["output_tokens"] == 3
    error = events(stream.error(ProxyError("upstream_timeout", "slow")))
    assert error == [
        (
            "error",
            {
                "type": "error",
                "sequence_number": len(seen),
                "code": "upstream_timeout",
                "message": "slow",
                "param": None,
            },
        )
    ]


def test_a_messages_prefill_continues_the_last_assistant_turn() -> None:
    turns = [
        {"role": "user", "content": "JSON please"},
        {"role": "assistant", "content": [{"type": "text", "text": "{"}]},
    ]
    chat = anthropic_messages.to_chat({"max_tokens": 5, "messages": turns})
    assert chat["messages"][-1] == {"role": "assistant", "content": "{"}
    assert chat["continue_final_message"] is True and chat["add_generation_prompt"] is False
    answered = anthropic_messages.to_chat({"max_tokens": 5, "messages": turns[:1]})
    assert "continue_final_message" not in answered and "add_generation_prompt" not in answered
