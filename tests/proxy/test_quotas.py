"""Issue 30 finding 6, black-box: what one agent may ask for and store (real ledger with small per-rollout limits,
real proxy with small request limits, stand-in engine, on loopback).

The probe saw one call with `n=100000` store a 65.6 MB event and stall the ledger 4.4 s, and one token take the
memory-store ledger from 50 to 1,596 MiB: nothing capped `n`, output tokens, or what one rollout stores.
"""

from __future__ import annotations

import asyncio
import collections
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from services.client import agent_token
from tests.support.procs import ServiceProcess, free_port, start_ledger

from .conftest import KEY, MODEL, Http, base_url, engine_requests, event_url, new_rollout, run_proxy

MAX_EVENTS = 8
MAX_N = 4
MAX_OUTPUT_TOKENS = 1000
AGENTS = 8
ROUNDS = 2  # each well-behaved agent stores 3 events a round, within MAX_EVENTS
USER = [{"role": "user", "content": "What is 2 + 2?"}]


@pytest.fixture(scope="module")
def ledger() -> Iterator[ServiceProcess]:
    """The ledger with a small event limit per rollout and its metrics endpoint (`metrics_url`)."""
    port = free_port()
    args = ["--max-rollout-events", str(MAX_EVENTS), "--metrics-port", str(port)]
    with start_ledger(key=KEY, extra_args=args) as process:
        process.metrics_url = f"http://127.0.0.1:{port}/metrics"  # type: ignore[attr-defined]
        yield process


def _proxy_rejected(proxy: Http, code: str) -> float:
    text = httpx.get(f"{proxy.url}/metrics").text
    found = re.search(rf'^agl_proxy_rejected_total\{{code="{code}"\}} ([\d.e+]+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def _ledger_refusals(ledger: ServiceProcess) -> float:
    text = httpx.get(ledger.metrics_url).text  # type: ignore[attr-defined]
    found = re.search(r'^agl_ledger_appends_refused_total\{limit="rollout_events"\} ([\d.e+]+)$', text, re.M)
    assert found, text[:2000]
    return float(found.group(1))


@pytest.fixture(scope="module")
def proxy(ledger: ServiceProcess, engine: Http) -> Iterator[Http]:
    args = ["--max-n", str(MAX_N), "--max-output-tokens", str(MAX_OUTPUT_TOKENS)]
    with run_proxy(ledger.address, args=args) as process:
        yield process


def _auth(rollout_id: str) -> dict[str, str]:
    return {"authorization": f"Bearer {agent_token(KEY, rollout_id, 'at-1')}"}


def _openai_message(body: dict[str, Any], code: str) -> str:
    assert body["error"]["code"] == code and body["error"]["type"] == "invalid_request_error", body
    return body["error"]["message"]


def _anthropic_message(body: dict[str, Any], kind: str) -> str:
    assert body["type"] == "error" and body["error"]["type"] == kind, body
    return body["error"]["message"]


OVER_LIMIT = [
    ("chat/completions", {"messages": USER, "n": MAX_N + 1}, "n", MAX_N + 1),
    ("chat/completions", {"messages": USER, "max_tokens": 100_000}, "max_tokens", 100_000),
    ("chat/completions", {"messages": USER, "max_completion_tokens": 1e300}, "max_completion_tokens", 1e300),
    ("completions", {"prompt": "2 + 2 =", "n": 100_000}, "n", 100_000),
    ("completions", {"prompt": "2 + 2 =", "best_of": MAX_N + 1}, "best_of", MAX_N + 1),
    ("completions", {"prompt": "2 + 2 =", "max_tokens": MAX_OUTPUT_TOKENS + 1}, "max_tokens", MAX_OUTPUT_TOKENS + 1),
    ("messages", {"messages": USER, "max_tokens": MAX_OUTPUT_TOKENS + 1}, "max_tokens", MAX_OUTPUT_TOKENS + 1),
    ("responses", {"input": "What is 2 + 2?", "max_output_tokens": 50_000}, "max_output_tokens", 50_000),
]


@pytest.mark.parametrize(("path", "body", "field", "value"), OVER_LIMIT, ids=[f"{c[0]}-{c[2]}" for c in OVER_LIMIT])
async def test_a_call_asking_for_more_than_the_limits_is_a_400_in_its_api_s_shape_and_reaches_no_engine(
    proxy: Http, engine: Http, client, path: str, body: dict[str, Any], field: str, value: float
) -> None:
    rid = await new_rollout(client)
    before, rejected = engine_requests(engine)["requests"], _proxy_rejected(proxy, "over_request_limit")
    async with httpx.AsyncClient(timeout=30) as http:
        reply = await http.post(f"{base_url(proxy, rid)}/{path}", json={"model": MODEL, **body}, headers=_auth(rid))
    assert reply.status_code == 400, reply.text
    assert _proxy_rejected(proxy, "over_request_limit") == rejected + 1
    if path == "messages":
        message = _anthropic_message(reply.json(), "invalid_request_error")
    else:
        message = _openai_message(reply.json(), "over_request_limit")
    limit, setting = (MAX_N, "--max-n") if field in ("n", "best_of") else (MAX_OUTPUT_TOKENS, "--max-output-tokens")
    assert f"`{field}` is {value}, over this proxy's limit of {limit:,} ({setting}, AGL_PROXY_" in message, message
    assert engine_requests(engine)["requests"] == before
    assert await client.list_events(rid) == []


async def test_calls_at_the_limits_are_served(proxy: Http, client) -> None:
    rid = await new_rollout(client)
    calls = [
        ("chat/completions", {"messages": USER, "n": MAX_N, "max_tokens": MAX_OUTPUT_TOKENS}),
        ("completions", {"prompt": "2 + 2 =", "max_tokens": MAX_OUTPUT_TOKENS}),
        ("messages", {"messages": USER, "max_tokens": MAX_OUTPUT_TOKENS}),
        ("responses", {"input": "What is 2 + 2?", "max_output_tokens": MAX_OUTPUT_TOKENS}),
    ]
    async with httpx.AsyncClient(timeout=30) as http:
        for path, body in calls:
            reply = await http.post(f"{base_url(proxy, rid)}/{path}", json={"model": MODEL, **body}, headers=_auth(rid))
            assert reply.status_code == 200, (path, reply.text)
    assert len(await client.list_events(rid)) == len(calls)


async def test_a_rollout_at_its_ledger_limit_gets_413_and_other_agents_lose_nothing(
    proxy: Http, ledger: ServiceProcess, client
) -> None:
    """One agent posting past its rollout's event limit, at full rate, among 8 agents whose appends share its
    merged ledger requests: it gets 413 naming its rollout and the limit, they get every answer and event."""
    full = await new_rollout(client)
    good = [await new_rollout(client) for _ in range(AGENTS)]
    statuses: dict[str, collections.Counter[int]] = {rid: collections.Counter() for rid in good}
    refusals: list[httpx.Response] = []
    done = asyncio.Event()
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=64)) as http:
        for k in range(MAX_EVENTS):
            note = {"event_type": "note", "data": {"k": k}}
            assert (await http.post(event_url(proxy, full), json=note, headers=_auth(full))).status_code == 200

        async def over_limit() -> None:
            while not done.is_set():
                reply = await http.post(
                    event_url(proxy, full), json={"event_type": "note", "data": {}}, headers=_auth(full)
                )
                refusals.append(reply)

        async def behave(rid: str) -> None:
            for k in range(ROUNDS):
                url = f"{base_url(proxy, rid)}/chat/completions"
                chat = {"model": MODEL, "messages": USER}
                statuses[rid][(await http.post(url, json=chat, headers=_auth(rid))).status_code] += 1
                note = {"event_type": "note", "data": {"k": k}}
                statuses[rid][(await http.post(event_url(proxy, rid), json=note, headers=_auth(rid))).status_code] += 1
                reward = {"event_type": "reward", "data": {"value": float(k)}}
                reply = await http.post(event_url(proxy, rid), json=reward, headers=_auth(rid))
                statuses[rid][reply.status_code] += 1

        refused_before, rejected_before = _ledger_refusals(ledger), _proxy_rejected(proxy, "quota_exceeded")
        tasks = [asyncio.create_task(over_limit()) for _ in range(AGENTS)]
        try:
            await asyncio.gather(*(behave(rid) for rid in good))
        finally:
            done.set()
            await asyncio.gather(*tasks)
        chat_url = f"{base_url(proxy, full)}/chat/completions"
        call = await http.post(chat_url, json={"model": MODEL, "messages": USER}, headers=_auth(full))
        messages_url = f"{base_url(proxy, full)}/messages"
        anthropic = {"model": MODEL, "messages": USER, "max_tokens": 16}
        anthropic_call = await http.post(messages_url, json=anthropic, headers=_auth(full))
    assert refusals and {r.status_code for r in refusals} == {413}
    # The ledger refused more requests than the agent got 413s: some were merged requests, sent again in parts.
    assert _ledger_refusals(ledger) - refused_before > len(refusals) + 2
    assert _proxy_rejected(proxy, "quota_exceeded") - rejected_before == len(refusals) + 2
    message = _openai_message(refusals[0].json(), "quota_exceeded")
    assert f"rollout {full} holds {MAX_EVENTS} events, its limit of {MAX_EVENTS} events per rollout" in message
    assert "AGL_LEDGER_MAX_ROLLOUT_EVENTS" in message and "not recorded" in message
    assert call.status_code == 413 and full in _openai_message(call.json(), "quota_exceeded")
    assert anthropic_call.status_code == 413 and full in _anthropic_message(anthropic_call.json(), "request_too_large")
    assert statuses == {rid: collections.Counter({200: 3 * ROUNDS}) for rid in good}
    for rid in good:
        kinds = collections.Counter(e.event_type for e in await client.list_events(rid))
        assert kinds == {"model_request": ROUNDS, "note": ROUNDS, "reward": ROUNDS}, kinds
    assert [e.data_json for e in await client.list_events(full)] == [f'{{"k": {k}}}' for k in range(MAX_EVENTS)]
