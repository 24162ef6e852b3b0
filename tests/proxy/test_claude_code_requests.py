"""The Messages API requests Claude Code sends, unmodified, through the real proxy to a stand-in engine: system turns
inside `messages`, count_tokens, thinking, cache_control, metadata, context_management, output_config and beta
headers; each answered as documented (docs/reference/agent-apis.md) and recorded as rendered. Refusals come in
Anthropic's shape and words."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest

from services._gen.agl.v1 import event_pb2
from services.client import LedgerClient
from services.standin import model as standin_model
from services.standin.tokenizer import ToyTokenizer
from tests.support.procs import ServiceProcess

from .conftest import KEY, MODEL, Http, base_url, engine_requests, new_rollout, register, run_standin

CONTEXT = 4000  # the stand-in's context length here
# As Claude Code sends them: its beta list, the SDK's version header.
HEADERS = {
    "x-api-key": KEY,
    "anthropic-version": "2023-06-01",
    "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27",
}
BASH = {
    "name": "Bash",
    "description": "Runs a shell command and returns its output.",
    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    "cache_control": {"type": "ephemeral"},
}


def claude_code_body(**changes: Any) -> dict[str, Any]:
    """A first call shaped like Claude Code's: system blocks with cache_control, a system turn inside `messages`,
    thinking with a budget, metadata, context_management, output_config and a large max_tokens."""
    body: dict[str, Any] = {
        "model": "claude-sonnet-4-5-20250929",
        "max_tokens": 32000,
        "system": [
            {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
            {"type": "text", "text": "Work in /tmp/task.", "cache_control": {"type": "ephemeral"}},
        ],
        "messages": [
            {"role": "system", "content": "Git status: clean."},
            {"role": "user", "content": [{"type": "text", "text": "What is 6 * 7?",
                                          "cache_control": {"type": "ephemeral"}}]},
            {"role": "system", "content": [{"type": "text", "text": "Today's date is 2026-12-05."}]},
        ],
        "tools": [BASH],
        "thinking": {"type": "enabled", "budget_tokens": 31999},
        "metadata": {"user_id": "user_0f3a_account__session_9c1e"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"},
        "cache_control": {"type": "ephemeral"},
        "stream": False,
    }  # fmt: skip
    body.update(changes)
    return body


@pytest.fixture(scope="module")
def engine(ledger: ServiceProcess) -> Iterator[Http]:
    with run_standin(args=["--max-model-len", str(CONTEXT)]) as standin:
        register(ledger.address, standin)
        yield standin


def messages_url(proxy: Http, rollout_id: str, mode: str = "train") -> str:
    return f"{base_url(proxy, rollout_id, mode=mode)}/messages"


async def recorded_calls(client: LedgerClient, rollout_id: str) -> list[event_pb2.ModelRequest]:
    return [e.model_request for e in await client.list_events(rollout_id, event_type="model_request")]


def prompt_tokens(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
    """The stand-in's prompt for chat messages: its template, its tokenizer (deterministic ids)."""
    return ToyTokenizer().encode(standin_model.render_chat(messages, tools))


async def test_a_claude_code_first_call_is_answered_and_recorded_as_rendered(
    proxy: Http, engine: Http, client: LedgerClient
) -> None:
    rollout_id = await new_rollout(client)
    async with httpx.AsyncClient(timeout=30) as http:
        reply = await http.post(
            f"{messages_url(proxy, rollout_id)}?beta=true", json=claude_code_body(), headers=HEADERS
        )
    assert reply.status_code == 200, reply.text
    assert reply.json()["content"][0]["type"] == "text"
    sent = engine_requests(engine)["received"][-1]["body"]
    # A system turn before the conversation joins the system prompt; one after it is a user turn in reminder tags.
    assert sent["messages"] == [
        {"role": "system", "content": "You are Claude Code, Anthropic's official CLI for Claude.\nWork in /tmp/task."
                                      "\n\nGit status: clean."},
        {"role": "user", "content": "What is 6 * 7?"},
        {"role": "user", "content": "<system-reminder>\nToday's date is 2026-12-05.\n</system-reminder>"},
    ]  # fmt: skip
    assert sent["model"] == MODEL  # Claude's model name goes to the run's policy
    assert sent["chat_template_kwargs"] == {"enable_thinking": True}
    # 32,000 asked of a 4,000-position engine: sent as the context length, vLLM grants what the prompt leaves.
    assert sent["max_tokens"] == CONTEXT
    for ignored in ("metadata", "context_management", "output_config", "cache_control", "thinking"):
        assert ignored not in sent
    (recorded,) = await recorded_calls(client, rollout_id)
    assert json.loads(recorded.request_json)["messages"] == sent["messages"]
    tools = [{"type": "function", "function": {"name": "Bash", "parameters": BASH["input_schema"],
                                               "description": BASH["description"]}}]  # fmt: skip
    assert list(recorded.prompt_token_ids) == prompt_tokens(sent["messages"], tools)
    assert recorded.status == event_pb2.MODEL_REQUEST_STATUS_OK and recorded.api == "anthropic.messages"
    assert recorded.requested_max_tokens == 32000
    assert recorded.granted_max_tokens == CONTEXT - len(recorded.prompt_token_ids)


@pytest.mark.parametrize(
    ("thinking", "template_kwargs", "expected"),
    [
        ({"type": "adaptive"}, None, {"enable_thinking": True}),
        ({"type": "disabled"}, None, {"enable_thinking": False}),
        ({"type": "enabled", "budget_tokens": 1024}, {"enable_thinking": False}, {"enable_thinking": False}),
        (None, None, None),
    ],
)
async def test_thinking_is_the_templates_reasoning_switch(
    proxy: Http, engine: Http, client: LedgerClient, thinking, template_kwargs, expected
) -> None:
    """Adaptive and enabled switch reasoning on, disabled off; the agent's own chat_template_kwargs win."""
    rollout_id = await new_rollout(client)
    body = claude_code_body(thinking=thinking)
    if template_kwargs is not None:
        body["chat_template_kwargs"] = template_kwargs
    async with httpx.AsyncClient(timeout=30) as http:
        reply = await http.post(messages_url(proxy, rollout_id), json=body, headers=HEADERS)
    assert reply.status_code == 200, reply.text
    assert engine_requests(engine)["received"][-1]["body"].get("chat_template_kwargs") == expected


async def test_output_config_format_is_the_engines_structured_output(
    proxy: Http, engine: Http, client: LedgerClient
) -> None:
    rollout_id = await new_rollout(client)
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}}
    body = claude_code_body(output_config={"effort": "low", "format": {"type": "json_schema", "schema": schema}})
    async with httpx.AsyncClient(timeout=30) as http:
        reply = await http.post(messages_url(proxy, rollout_id, mode="val"), json=body, headers=HEADERS)
        assert reply.status_code == 200, reply.text
        sent = engine_requests(engine)["received"][-1]["body"]
        assert sent["response_format"] == {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}
        # A train call samples unconstrained (free_sampling.py): the format is left out and the call says so.
        reply = await http.post(messages_url(proxy, rollout_id), json=body, headers=HEADERS)
    assert reply.status_code == 200, reply.text
    assert "response_format" not in engine_requests(engine)["received"][-1]["body"]
    train_call = (await recorded_calls(client, rollout_id))[-1]
    assert any("response_format" in warning for warning in train_call.warnings), train_call.warnings


async def test_count_tokens_is_the_engines_count_of_the_rendered_prompt(
    proxy: Http, engine: Http, client: LedgerClient
) -> None:
    """The count equals the prompt a Messages call with the same body gets (its usage and its recorded tokens),
    is asked of the engine's /tokenize, and records nothing."""
    rollout_id = await new_rollout(client)
    body = claude_code_body()
    counting = {k: v for k, v in body.items() if k not in ("max_tokens", "stream", "metadata")}
    async with httpx.AsyncClient(timeout=30) as http:
        counted = await http.post(f"{messages_url(proxy, rollout_id)}/count_tokens?beta=true", json=counting,
                                  headers=HEADERS)  # fmt: skip
        assert counted.status_code == 200, counted.text
        asked = engine_requests(engine)["received"][-1]
        assert not await recorded_calls(client, rollout_id)
        called = await http.post(messages_url(proxy, rollout_id), json=body, headers=HEADERS)
    assert asked["path"] == "/tokenize" and asked["body"]["model"] == MODEL
    assert asked["body"]["chat_template_kwargs"] == {"enable_thinking": True}
    (recorded,) = await recorded_calls(client, rollout_id)
    assert counted.json() == {"input_tokens": len(recorded.prompt_token_ids)}
    assert called.json()["usage"]["input_tokens"] == len(recorded.prompt_token_ids)
    with anthropic.Anthropic(
        base_url=base_url(proxy, rollout_id).removesuffix("/v1"), api_key=KEY, max_retries=0
    ) as sdk:
        by_sdk = sdk.messages.count_tokens(model="claude-haiku-4-5", messages=[{"role": "user", "content": "hi"}])
    assert by_sdk.input_tokens == len(prompt_tokens([{"role": "user", "content": "hi"}], None))


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"thinking": {"type": "sometimes"}}, "`thinking.type`"),
        ({"thinking": {"type": "enabled"}}, "`thinking.budget_tokens`"),
        ({"metadata": "user-1"}, "`metadata`"),
        ({"metadata": {"user_id": 7}}, "`metadata.user_id`"),
        ({"context_management": {"edits": "all"}}, "`context_management.edits`"),
        ({"output_config": {"effort": 3}}, "`output_config.effort`"),
        ({"output_config": {"format": {"type": "regex"}}}, "`output_config.format`"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
    ],
)
async def test_bad_values_are_a_400_naming_the_field_in_anthropics_shape(
    proxy: Http, engine: Http, client: LedgerClient, change, named
) -> None:
    rollout_id = await new_rollout(client)
    async with httpx.AsyncClient(timeout=30) as http:
        for path in ("", "/count_tokens"):
            reply = await http.post(f"{messages_url(proxy, rollout_id)}{path}", json=claude_code_body(**change),
                                    headers=HEADERS)  # fmt: skip
            assert reply.status_code == 400, (path, reply.text)
            assert reply.json()["type"] == "error" and reply.json()["error"]["type"] == "invalid_request_error"
            assert named in reply.json()["error"]["message"], reply.json()


async def test_a_prompt_longer_than_the_context_is_refused_in_anthropics_words(
    proxy: Http, engine: Http, client: LedgerClient
) -> None:
    """Claude Code compacts its history when told "prompt is too long: N tokens > M maximum"."""
    rollout_id = await new_rollout(client)
    long_turn = {"role": "user", "content": "word " * CONTEXT}
    with (
        anthropic.Anthropic(
            base_url=base_url(proxy, rollout_id).removesuffix("/v1"), api_key=KEY, max_retries=0
        ) as sdk,
        pytest.raises(anthropic.BadRequestError) as refused,
    ):
        sdk.messages.create(model="claude-sonnet-4-5", max_tokens=64, messages=[long_turn])
    (recorded,) = await recorded_calls(client, rollout_id)
    engine_said = json.loads(recorded.response_json)["error"]["message"]
    prompt = len(prompt_tokens([long_turn], None))
    assert f"your prompt contains {prompt} input tokens" in engine_said
    assert refused.value.body["error"] == {
        "type": "invalid_request_error",
        "message": f"prompt is too long: {prompt} tokens > {CONTEXT} maximum",
    }
