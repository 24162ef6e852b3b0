"""Roles from the model names an agent sends (issue 44 items 1 and 3): a rollout's role map (the label `agl_roles`)
sends each call, in every agent API, to the policy its requested model name maps to, and the record says which
(requested_model, model, role); a name the map does not take goes to the rollout's own policy or is refused in the
agent's API shape; a map that cannot be read is refused on every call, naming the problem.

Real ledger, real proxy; two stand-in engines: one serving the proxy's own model (the run's policy), one a judge."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import httpx
import pytest

from services import role_map
from services._gen.agl.v1 import event_pb2, model_pb2, rollout_pb2
from services.client import InvalidArgument, LedgerClient
from tests.support.procs import ServiceProcess

from .conftest import AUTH, MODEL, Http, base_url, run_proxy, run_standin

JUDGE = "judge-7b"
POLICY = event_pb2.MODEL_REQUEST_ROLE_POLICY
OTHER = event_pb2.MODEL_REQUEST_ROLE_OTHER_POLICY
FROZEN = event_pb2.MODEL_REQUEST_ROLE_FROZEN


@pytest.fixture(scope="module")
def engines(ledger: ServiceProcess) -> Iterator[tuple[Http, Http]]:
    with run_standin() as own, run_standin(JUDGE) as judge:
        yield own, judge


@pytest.fixture(scope="module")
def proxy(ledger: ServiceProcess, engines: tuple[Http, Http]) -> Iterator[Http]:
    with run_proxy(ledger.address) as process:
        yield process


async def registered(client: LedgerClient, proxy: Http, own: Http, judge: Http) -> None:
    await client.register_models([
        model_pb2.ModelEndpoint(model_name=MODEL, endpoint=f"{own.url}/v1", version=1),
        model_pb2.ModelEndpoint(model_name=JUDGE, endpoint=f"{judge.url}/v1", version=1),
    ])  # fmt: skip
    deadline = time.monotonic() + 10
    while {MODEL, JUDGE} - set(httpx.get(f"{proxy.url}/status").json()["models"]):
        assert time.monotonic() < deadline, "both models routed"
        time.sleep(0.05)


async def rollout(client: LedgerClient, roles: str) -> str:
    rollout_id = f"ro-roles-{uuid.uuid4().hex[:10]}"
    spec = rollout_pb2.RolloutSpec(
        rollout_id=rollout_id, input_json="{}", is_train=True,
        metadata=rollout_pb2.RolloutMetadata(labels={role_map.LABEL_ROLES: roles}),
    )  # fmt: skip
    await client.create_rollouts([spec])
    await client.update_status(rollout_id, rollout_pb2.ROLLOUT_STATE_RUNNING, attempt_id="at-1")
    return rollout_id


def chat(model: str) -> tuple[str, dict]:
    return "/chat/completions", {"model": model, "messages": [{"role": "user", "content": "What is 2 + 3?"}]}


def anthropic(model: str) -> tuple[str, dict]:
    return "/messages", {"model": model, "max_tokens": 16, "messages": [{"role": "user", "content": "Check 2 + 3."}]}


def responses(model: str) -> tuple[str, dict]:
    return "/responses", {"model": model, "input": "Summarise 2 + 3.", "max_output_tokens": 16}


async def send(proxy: Http, rollout_id: str, request: tuple[str, dict]) -> httpx.Response:
    path, body = request
    async with httpx.AsyncClient(headers=AUTH, timeout=30) as http:
        return await http.post(f"{base_url(proxy, rollout_id)}{path}", json=body)


async def records(client: LedgerClient, rollout_id: str) -> list[tuple[str, str, str, int, int]]:
    """(requested model, model, endpoint, role, HTTP status) of each recorded call."""
    events = await client.list_events(rollout_id, event_type="model_request")
    return [(m.requested_model, m.model, m.endpoint, m.role, m.http_status) for m in (e.model_request for e in events)]


async def test_each_call_goes_to_its_roles_policy_in_every_api_and_unmapped_names_are_refused_in_the_agents_shape(
    proxy: Http, engines: tuple[Http, Http], client: LedgerClient
) -> None:
    own, judge = engines
    await registered(client, proxy, own, judge)
    roles = role_map.from_settings(["gpt-4o=policy", "gpt-4o-*=policy"], [f"claude-haiku-*={JUDGE}"], "refuse")
    rollout_id = await rollout(client, roles.to_label())
    sent = [chat("gpt-4o"), anthropic("claude-haiku-4-5"), responses("claude-haiku-4-5"), anthropic("gpt-4o-mini")]
    replies = [await send(proxy, rollout_id, request) for request in sent]
    assert [r.status_code for r in replies] == [200] * 4, [r.text for r in replies]
    main, side = f"{own.url}/v1", f"{judge.url}/v1"
    assert await records(client, rollout_id) == [
        ("gpt-4o", MODEL, main, POLICY, 200),
        ("claude-haiku-4-5", JUDGE, side, FROZEN, 200),
        ("claude-haiku-4-5", JUDGE, side, FROZEN, 200),
        ("gpt-4o-mini", MODEL, main, POLICY, 200),
    ]
    # A name the map does not take: 404 naming the map, in the agent's own API's shape, and recorded as refused.
    refused = await send(proxy, rollout_id, chat("gpt-5"))
    assert refused.status_code == 404 and refused.json()["error"]["code"] == "model_not_mapped", refused.text
    assert "'gpt-5' matches no role" in refused.json()["error"]["message"]
    assert f"claude-haiku-*={JUDGE} (frozen)" in refused.json()["error"]["message"]
    refused = await send(proxy, rollout_id, anthropic("claude-opus-4"))
    assert refused.status_code == 404 and refused.json()["type"] == "error", refused.text
    assert refused.json()["error"]["type"] == "not_found_error" and "'claude-opus-4'" in refused.text
    assert (await records(client, rollout_id))[4:] == [
        ("gpt-5", MODEL, "", 0, 404),
        ("claude-opus-4", MODEL, "", 0, 404),
    ]


async def test_unmapped_names_go_to_the_rollouts_policy_and_a_role_of_another_policy_is_labelled_so(
    proxy: Http, engines: tuple[Http, Http], client: LedgerClient
) -> None:
    own, judge = engines
    await registered(client, proxy, own, judge)
    rollout_id = await rollout(client, role_map.from_settings([f"claude-haiku-*={JUDGE}"], []).to_label())
    for request in (anthropic("claude-sonnet-4-5"), anthropic("claude-haiku-4-5"), chat("")):
        reply = await send(proxy, rollout_id, request)
        assert reply.status_code == 200, reply.text
    main, side = f"{own.url}/v1", f"{judge.url}/v1"
    assert await records(client, rollout_id) == [
        ("claude-sonnet-4-5", MODEL, main, POLICY, 200),
        ("claude-haiku-4-5", JUDGE, side, OTHER, 200),
        ("", MODEL, main, POLICY, 200),
    ]


async def test_a_role_map_that_cannot_be_read_is_refused_at_creation_so_no_call_of_it_reaches_the_proxy(
    proxy: Http, engines: tuple[Http, Http], client: LedgerClient
) -> None:
    # The ledger refuses such a label with its rollout (services/ledger/validation.py); the proxy's own refusal
    # (400 role_map_invalid) stays behind it for a ledger that did not check.
    own, judge = engines
    await registered(client, proxy, own, judge)
    bad = '{"roles": [{"match": "claude haiku", "policy": "judge-7b"}]}'
    with pytest.raises(InvalidArgument) as refused:
        await rollout(client, bad)
    assert "agl_roles" in str(refused.value) and "role 'claude haiku': a model name or pattern is" in str(refused.value)
    assert [r for r in await client.list_rollouts() if r.metadata.labels.get(role_map.LABEL_ROLES) == bad] == []
