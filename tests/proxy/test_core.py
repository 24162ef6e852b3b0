"""The proxy's pure core: rewriting, capture, stream assembly, routing, retry policy, auth, SSE, events."""

from __future__ import annotations

import json
import random

import pytest

from services._gen.agl.v1 import event_pb2
from services.client import RetryPolicy, agent_token
from services.proxy.auth import Authorizer, presented_key
from services.proxy.call.capture import StreamAssembler, capture_response
from services.proxy.call.rewrite import CHAT, COMPLETIONS, RewriteSettings, parse_body, rewrite, validate
from services.proxy.call.sse import DONE, SSESplitter
from services.proxy.engines.retry import parse_retry_after, retryable_status
from services.proxy.engines.routing import Endpoint, RoutingTable
from services.proxy.errors import ERROR_TABLE, ProxyError, ledger_error
from services.proxy.events.agent_events import agent_event
from services.standin.engine import full_body, generate_chat, generate_completion, stream_chunks
from services.standin.tokenizer import ToyTokenizer, token_logprob

MODEL = "toy"
SETTINGS = RewriteSettings(model_name=MODEL, train_temperature=0.7, val_temperature=0.0)
CALC_TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
    },
}


# -- rewriting ---------------------------------------------------------------------------------------------------


def test_train_mode_forces_model_temperature_token_ids_and_logprobs() -> None:
    body = {"model": "whatever", "messages": [{"role": "user", "content": "hi"}], "temperature": 1.5, "tools": [1]}
    out = rewrite(body, CHAT, "train", SETTINGS)
    assert out["model"] == MODEL and out["temperature"] == 0.7
    assert out["return_token_ids"] is True and out["logprobs"] is True
    assert out["tools"] == [1]
    assert body["model"] == "whatever"  # the agent's body is left alone


def test_val_mode_sets_model_temperature_and_token_ids_only() -> None:
    """v1.0's gateway forces token ids in validation too (an agent may decode them), but no log-probs."""
    body = {"model": "x", "prompt": "p", "seed": 3, "max_tokens": 5, "top_k": 4}
    out = rewrite(body, COMPLETIONS, "val", SETTINGS)
    expected = {"model": MODEL, "prompt": "p", "seed": 3, "max_tokens": 5, "top_k": 4, "temperature": 0.0}
    assert out == {**expected, "return_token_ids": True}


def test_train_mode_samples_the_whole_distribution_whatever_the_agent_asks() -> None:
    """The trainer recomputes full-distribution log-probs: an agent's truncation or penalties would make the
    sampled tokens off-policy, so train calls get the neutral values (validation keeps the agent's)."""
    shaped = {"top_p": 0.8, "top_k": 20, "min_p": 0.1, "presence_penalty": 1.5, "frequency_penalty": 0.5}
    body = {"messages": [{"role": "user", "content": "hi"}], **shaped, "repetition_penalty": 1.2}
    body["logit_bias"] = {"5": 9}
    out = rewrite(body, CHAT, "train", SETTINGS)
    assert {key: out[key] for key in (*shaped, "repetition_penalty")} == {
        "top_p": 1.0,
        "top_k": 0,
        "min_p": 0.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "repetition_penalty": 1.0,
    }
    assert "logit_bias" not in out
    plain = rewrite({"prompt": "p"}, COMPLETIONS, "train", SETTINGS)
    assert plain["top_p"] == 1.0 and plain["top_k"] == 0
    val = rewrite(body, CHAT, "val", SETTINGS)
    assert val["top_k"] == 20 and val["logit_bias"] == {"5": 9}


def test_completions_logprobs_is_an_integer_and_keeps_a_larger_request() -> None:
    assert rewrite({"prompt": "p"}, COMPLETIONS, "train", SETTINGS)["logprobs"] == 1
    assert rewrite({"prompt": "p", "logprobs": 5}, COMPLETIONS, "train", SETTINGS)["logprobs"] == 5


def test_keep_temperature_and_no_logprobs_settings() -> None:
    settings = RewriteSettings(model_name=MODEL, train_temperature=None, val_temperature=None, logprobs=False)
    out = rewrite({"messages": [{}], "temperature": 0.3}, CHAT, "train", settings)
    assert out["temperature"] == 0.3 and "logprobs" not in out and out["return_token_ids"] is True


@pytest.mark.parametrize(
    ("raw", "kind"),
    [(b"{not json", "invalid_json"), (b"[1, 2]", "invalid_json"), (b"", "invalid_json")],
)
def test_parse_body_rejects_non_objects(raw: bytes, kind: str) -> None:
    with pytest.raises(ProxyError) as caught:
        parse_body(raw)
    assert caught.value.kind == kind and caught.value.status == 400


@pytest.mark.parametrize(
    ("body", "api"),
    [
        ({"messages": []}, CHAT),
        ({"messages": "hi"}, CHAT),
        ({"messages": [{}], "stream": "yes"}, CHAT),
        ({"messages": [{}], "n": 0}, CHAT),
        ({"messages": [{}], "logprobs": 3}, CHAT),
        ({"prompt": ""}, COMPLETIONS),
        ({"prompt": "x", "logprobs": True}, COMPLETIONS),
        ({"prompt": "x", "stream_options": []}, COMPLETIONS),
    ],
)
def test_validate_rejects_unsupported_values(body: dict, api: str) -> None:
    with pytest.raises(ProxyError) as caught:
        validate(body, api)
    assert caught.value.status == 400


# -- capture -----------------------------------------------------------------------------------------------------


def _expected_logprobs(ids: list[int]) -> list[float]:
    return [token_logprob(token, position) for position, token in enumerate(ids)]


def test_capture_chat_reads_vllm_fields() -> None:
    tok = ToyTokenizer()
    request = {"messages": [{"role": "user", "content": "What is 6 * 7?"}], "logprobs": True, "return_token_ids": True}
    gen = generate_chat(request, MODEL, tok)
    capture = capture_response(json.loads(json.dumps(full_body(gen, tok))), CHAT)
    assert capture.prompt_token_ids == gen.prompt_token_ids and capture.prompt_token_ids
    assert capture.response_token_ids == gen.choices[0].token_ids
    assert capture.response_logprobs == _expected_logprobs(gen.choices[0].token_ids)
    assert capture.has_logprobs and capture.finish_reason == "stop" and capture.model == MODEL
    assert capture.usage == {
        "prompt_tokens": len(gen.prompt_token_ids),
        "completion_tokens": 4,
        "total_tokens": 4 + len(gen.prompt_token_ids),
    }


def test_capture_completion_reads_per_choice_prompt_ids() -> None:
    tok = ToyTokenizer()
    gen = generate_completion({"prompt": "Q: 2 plus 2?", "logprobs": 2, "return_token_ids": True}, MODEL, tok)
    capture = capture_response(full_body(gen, tok), COMPLETIONS)
    assert capture.prompt_token_ids == tok.encode("Q: 2 plus 2?")
    assert capture.response_token_ids == gen.choices[0].token_ids
    assert capture.response_logprobs == _expected_logprobs(gen.choices[0].token_ids)


def test_capture_without_or_with_malformed_logprobs_is_null_not_an_error() -> None:
    tok = ToyTokenizer()
    gen = generate_chat({"messages": [{"role": "user", "content": "hi"}], "return_token_ids": True}, MODEL, tok)
    body = full_body(gen, tok)
    assert not capture_response(body, CHAT).has_logprobs
    body["choices"][0]["logprobs"] = {"content": [{"token": "x", "logprob": "bad"}]}
    capture = capture_response(body, CHAT)
    assert not capture.has_logprobs and capture.response_logprobs == []
    assert capture.response_token_ids == gen.choices[0].token_ids


@pytest.mark.parametrize(
    "token_ids, logprobs_content",
    [
        ([1, True, 3], None),  # a JSON true among the token ids
        ([1, 2.0, 3], None),
        ([1, "2", 3], None),
        (None, [{"token": "x", "logprob": None}]),
        (None, [{"token": "x"}]),  # no logprob key
        (None, ["x"]),  # an entry that is not an object
        (None, [{"token": "x", "logprob": False}]),
    ],
)
def test_capture_refuses_token_ids_and_logprobs_of_the_wrong_type(token_ids, logprobs_content) -> None:
    tok = ToyTokenizer()
    request = {"messages": [{"role": "user", "content": "hi"}], "return_token_ids": True, "logprobs": True}
    body = full_body(generate_chat(request, MODEL, tok), tok)
    choice = body["choices"][0]
    if token_ids is not None:
        choice["token_ids"] = token_ids
        capture = capture_response(body, CHAT)
        assert capture.response_token_ids == [] and not capture.has_logprobs  # no ids, so no log-probs to pair
    else:
        choice["token_ids"] = [7]
        choice["logprobs"] = {"content": logprobs_content}
        capture = capture_response(body, CHAT)
        assert capture.response_token_ids == [7] and not capture.has_logprobs and capture.response_logprobs == []


def test_capture_takes_integer_logprobs_as_floats() -> None:
    tok = ToyTokenizer()
    request = {"messages": [{"role": "user", "content": "hi"}], "return_token_ids": True, "logprobs": True}
    body = full_body(generate_chat(request, MODEL, tok), tok)
    body["choices"][0]["token_ids"] = [5, 6]
    body["choices"][0]["logprobs"] = {"content": [{"token": "a", "logprob": 0}, {"token": "b", "logprob": -1.5}]}
    capture = capture_response(body, CHAT)
    assert capture.has_logprobs and capture.response_logprobs == [0.0, -1.5]
    assert [type(v) for v in capture.response_logprobs] == [float, float]


def _assemble(api: str, request: dict) -> tuple[StreamAssembler, dict]:
    tok = ToyTokenizer()
    gen = generate_chat(request, MODEL, tok) if api == CHAT else generate_completion(request, MODEL, tok)
    assembler = StreamAssembler(api)
    for chunk in stream_chunks(gen, tok, include_usage=True):
        assembler.feed(json.loads(json.dumps(chunk)))
    return assembler, full_body(gen, tok)


@pytest.mark.parametrize("api", [CHAT, COMPLETIONS])
def test_stream_assembly_equals_the_non_streamed_capture(api: str) -> None:
    request = {"logprobs": True if api == CHAT else 1, "return_token_ids": True, "stream": True}
    request.update(
        {"messages": [{"role": "user", "content": "What is 9 - 4?"}]} if api == CHAT else {"prompt": "9 - 4 ="}
    )
    assembler, full = _assemble(api, request)
    streamed, direct = assembler.capture(), capture_response(full, api)
    assert streamed == direct
    assert streamed.response_token_ids and streamed.has_logprobs and streamed.usage is not None
    text_of = (lambda b: b["choices"][0]["message"]["content"]) if api == CHAT else (lambda b: b["choices"][0]["text"])
    assert text_of(assembler.response()) == text_of(full)


def test_stream_assembly_merges_tool_call_fragments() -> None:
    request = {"messages": [{"role": "user", "content": "What is 12 * 3?"}], "tools": [CALC_TOOL], "stream": True}
    request.update(logprobs=True, return_token_ids=True)
    assembler, full = _assemble(CHAT, request)
    message = assembler.response()["choices"][0]["message"]
    assert message["tool_calls"] == full["choices"][0]["message"]["tool_calls"]
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"expression": "12 * 3"}
    assert assembler.capture().finish_reason == "tool_calls"
    assert assembler.capture().response_token_ids == full["choices"][0]["token_ids"]


# -- routing -----------------------------------------------------------------------------------------------------


def test_rendezvous_routing_is_sticky_and_moves_only_the_removed_endpoints_rollouts() -> None:
    table = RoutingTable(MODEL)
    endpoints = [Endpoint(f"http://10.0.0.{i}:8000/v1") for i in range(4)]
    table.update(endpoints)
    keys = [f"ro-{i}" for i in range(400)]
    first = {k: table.ranked(k)[0] for k in keys}
    assert {k: table.ranked(k)[0] for k in keys} == first
    assert len(set(first.values())) == 4  # all endpoints get work
    table.update(endpoints[:3])
    after = {k: table.ranked(k)[0] for k in keys}
    moved = [k for k in keys if after[k] != first[k]]
    assert moved and all(first[k] == endpoints[3] for k in moved)
    assert all(after[k] == table.ranked(k)[0] for k in keys)


def test_routing_with_no_endpoint_is_empty() -> None:
    assert RoutingTable(MODEL).ranked("ro") == []


# -- retry policy ------------------------------------------------------------------------------------------------


def test_retryable_statuses() -> None:
    assert all(retryable_status(s) for s in (408, 409, 429, 500, 502, 503, 504))
    assert not any(retryable_status(s) for s in (400, 401, 404, 413, 422))


def test_backoff_is_jittered_capped_and_honours_retry_after() -> None:
    policy = RetryPolicy(attempts=10, initial_backoff_s=0.1, max_backoff_s=1.0)
    rng = random.Random(7)
    delays = [policy.backoff(n, rng=rng) for n in range(1, 10) for _ in range(50)]
    assert all(0 <= d <= 1.0 for d in delays) and len(set(delays)) > 100
    assert max(policy.backoff(1, rng=rng) for _ in range(100)) <= 0.1
    assert policy.backoff(1, retry_after_s=0.5, rng=rng) >= 0.5
    assert policy.backoff(1, retry_after_s=30, rng=rng) == 1.0
    assert parse_retry_after("2") == 2.0 and parse_retry_after("Wed, 21 Oct 2015") is None


# -- auth --------------------------------------------------------------------------------------------------------


def test_master_key_and_agent_token_scoping() -> None:
    auth = Authorizer("k")
    auth.require_rollout("k", "ro-a", "at-1")
    auth.require_rollout(agent_token("k", "ro-a", "at-1"), "ro-a", "at-1")
    for presented, rollout, attempt in [
        (agent_token("k", "ro-a", "at-1"), "ro-b", "at-1"),
        (agent_token("k", "ro-a", "at-1"), "ro-a", "at-2"),
        ("wrong", "ro-a", "at-1"),
        (None, "ro-a", "at-1"),
    ]:
        with pytest.raises(ProxyError) as caught:
            auth.require_rollout(presented, rollout, attempt)
        assert caught.value.status == 401
    with pytest.raises(ProxyError):
        auth.require_master(agent_token("k", "ro-a", "at-1"))
    Authorizer(None).require_master(None)


def test_presented_key_reads_bearer_and_x_api_key() -> None:
    assert presented_key({"authorization": "Bearer abc"}) == "abc"
    assert presented_key({"x-api-key": "xyz"}) == "xyz"
    assert presented_key({"authorization": "Basic abc"}) is None


# -- errors ------------------------------------------------------------------------------------------------------


def test_error_table_shapes_and_ledger_mapping() -> None:
    assert {status for status, _ in ERROR_TABLE.values()} >= {400, 401, 404, 409, 413, 422, 429, 502, 503, 504}
    err = ProxyError("paused", "later", headers={"Retry-After": "3"})
    assert err.status == 429 and err.body() == {
        "error": {"message": "later", "type": "rate_limit_error", "code": "paused"}
    }
    assert ledger_error("UNAVAILABLE", "down", "AppendEvents").status == 503
    assert ledger_error("NOT_FOUND", "no such rollout", "GetRollout").status == 404
    assert ledger_error("FAILED_PRECONDITION", "terminal", "AppendEvents").status == 409
    assert ledger_error("DATA_LOSS", "?", "AppendEvents").status == 500


# -- SSE ---------------------------------------------------------------------------------------------------------


def test_sse_splitter_reassembles_events_across_arbitrary_cuts() -> None:
    stream = b'data: {"a": 1}\n\n: ping\n\ndata: {"b": 2}\r\n\r\ndata: [DONE]\n\n'
    for cut in range(1, len(stream)):
        splitter = SSESplitter()
        events = splitter.feed(stream[:cut]) + splitter.feed(stream[cut:])
        assert [e.data for e in events] == [b'{"a": 1}', None, b'{"b": 2}', DONE]
        assert splitter.pending() == b""


# -- agent events ------------------------------------------------------------------------------------------------


def test_reward_event_needs_a_numeric_value() -> None:
    event = agent_event("ro", "at", {"event_type": "reward", "data": {"value": 1, "reason": "ok", "extra": [1]}})
    assert (
        event.reward.value == 1.0
        and event.reward.reason == "ok"
        and json.loads(event.reward.data_json) == {"extra": [1]}
    )
    for data in ({}, {"value": "1"}, {"value": True}, {"value": float("nan")}):
        with pytest.raises(ProxyError) as caught:
            agent_event("ro", "at", {"event_type": "reward", "data": data})
        assert caught.value.status == 422


def test_other_events_are_stored_as_is() -> None:
    event = agent_event("ro", "at", {"event_type": "note", "data": {"x": [1, {"y": None}]}})
    assert event.WhichOneof("payload") == "data_json" and json.loads(event.data_json) == {"x": [1, {"y": None}]}
    assert isinstance(event, event_pb2.Event)
    with pytest.raises(ProxyError):
        agent_event("ro", "at", {"event_type": "model_request", "data": {}})
