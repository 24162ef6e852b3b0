"""Routing from the ledger's live model registry: sticky per rollout, failover when the set changes or an engine
is down, 503 with no endpoint, model version recorded."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest

from services._gen.agl.v1 import event_pb2, model_pb2
from services.client import LedgerClient
from services.proxy.engines.routing import Endpoint, RoutingTable
from tests.support.procs import ServiceProcess, free_port

from .conftest import AUTH, MODEL, Http, base_url, new_rollout, run_proxy, run_standin

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "What is 1 + 1?"}]}


@pytest.fixture(scope="module")
def engines() -> Iterator[tuple[Http, Http]]:
    with run_standin() as first, run_standin() as second:
        yield first, second


@pytest.fixture(scope="module")
def proxy(ledger: ServiceProcess) -> Iterator[Http]:
    # The upstream's own failover, on its own: no label checks holding a dead engine back, no waiting for one to
    # come back (test_engine_check.py has those).
    args = ["--retry-attempts", "3", "--engine-check-seconds", "0", "--engine-wait-seconds", "0"]
    with run_proxy(ledger.address, args=args) as process:
        yield process


def endpoint(engine: Http | str, version: int = 1) -> model_pb2.ModelEndpoint:
    url = engine if isinstance(engine, str) else f"{engine.url}/v1"
    return model_pb2.ModelEndpoint(model_name=MODEL, endpoint=url, version=version)


async def set_endpoints(client: LedgerClient, proxy: Http, *endpoints: model_pb2.ModelEndpoint) -> None:
    """Makes the registry hold exactly these endpoints and waits until the proxy has applied the change."""
    await client.delete_models([model_pb2.ModelEndpointKey(model_name=MODEL)])
    if endpoints:
        await client.register_models(list(endpoints))
    deadline = time.monotonic() + 10
    while sorted(httpx.get(f"{proxy.url}/status").json()["endpoints"]) != sorted(e.endpoint for e in endpoints):
        assert time.monotonic() < deadline, "proxy did not see the endpoint change"
        await asyncio.sleep(0.02)


async def call(proxy: Http, rollout_id: str) -> httpx.Response:
    async with httpx.AsyncClient(headers=AUTH, timeout=30) as http:
        return await http.post(f"{base_url(proxy, rollout_id)}/chat/completions", json=CHAT)


async def endpoints_used(client: LedgerClient, rollout_id: str) -> list[str]:
    return [e.model_request.endpoint for e in await client.list_events(rollout_id, event_type="model_request")]


async def test_sticky_routing_and_failover_when_the_endpoint_set_changes(proxy, engines, client) -> None:
    first, second = engines
    await set_endpoints(client, proxy, endpoint(first), endpoint(second))
    rollouts = [await new_rollout(client) for _ in range(12)]
    for _ in range(3):
        assert all(r.status_code == 200 for r in await asyncio.gather(*(call(proxy, r) for r in rollouts)))
    placement = {}
    for rollout_id in rollouts:
        used = await endpoints_used(client, rollout_id)
        assert len(set(used)) == 1, f"{rollout_id} moved between engines: {used}"
        placement[rollout_id] = used[0]
    assert set(placement.values()) == {f"{first.url}/v1", f"{second.url}/v1"}

    await set_endpoints(client, proxy, endpoint(second))
    for rollout_id in rollouts:
        assert (await call(proxy, rollout_id)).status_code == 200
        assert (await endpoints_used(client, rollout_id))[-1] == f"{second.url}/v1"

    await set_endpoints(client, proxy, endpoint(first), endpoint(second))
    for rollout_id in rollouts:  # back to the full set: every rollout returns to its original engine
        assert (await call(proxy, rollout_id)).status_code == 200
        assert (await endpoints_used(client, rollout_id))[-1] == placement[rollout_id]


async def test_dead_engine_fails_over_to_the_next_ranked_one(proxy, engines, client) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"
    _, second = engines
    await set_endpoints(client, proxy, endpoint(dead))
    rollout_id = await new_rollout(client)
    response = await call(proxy, rollout_id)
    assert response.status_code == 502 and response.json()["error"]["code"] == "upstream_unreachable"
    (failed,) = await client.list_events(rollout_id)
    assert failed.model_request.status == event_pb2.MODEL_REQUEST_STATUS_ERROR
    assert failed.model_request.http_status == 502 and failed.model_request.retry_count == 2

    await set_endpoints(client, proxy, endpoint(dead), endpoint(second))
    table = RoutingTable(MODEL)
    table.update([Endpoint(dead), Endpoint(f"{second.url}/v1")])
    ids = (f"ro-{uuid.uuid4().hex[:12]}" for _ in range(1000))
    dead_first = next(i for i in ids if table.ranked(i)[0].url == dead)
    live_first = next(i for i in ids if table.ranked(i)[0].url != dead)
    for rollout_id, retries in ((dead_first, 1), (live_first, 0)):
        await new_rollout(client, rollout_id=rollout_id)
        assert (await call(proxy, rollout_id)).status_code == 200
        (event,) = await client.list_events(rollout_id)
        assert event.model_request.endpoint == f"{second.url}/v1" and event.model_request.retry_count == retries


async def test_no_endpoint_is_503_naming_the_model_and_version_is_recorded(proxy, engines, client) -> None:
    await set_endpoints(client, proxy)
    rollout_id = await new_rollout(client)
    response = await call(proxy, rollout_id)
    assert response.status_code == 503 and MODEL in response.json()["error"]["message"]
    assert await client.list_events(rollout_id) == []
    await set_endpoints(client, proxy, endpoint(engines[0], version=7))
    assert (await call(proxy, rollout_id)).status_code == 200
    (event,) = await client.list_events(rollout_id)
    assert event.model_request.model_version == 7


async def test_an_engine_at_an_older_version_is_held_back_until_it_serves_the_current_one(
    proxy, engines, client
) -> None:
    first, second = engines
    # The second engine restarted from the base model and registered again: version 0 while the run is at 3.
    await set_endpoints(client, proxy, endpoint(first, version=3), endpoint(second, version=0))
    rollouts = [await new_rollout(client) for _ in range(12)]
    assert all(r.status_code == 200 for r in await asyncio.gather(*(call(proxy, r) for r in rollouts)))
    for rollout_id in rollouts:
        (event,) = await client.list_events(rollout_id, event_type="model_request")
        assert event.model_request.endpoint == f"{first.url}/v1" and event.model_request.model_version == 3
    metrics = httpx.get(f"{proxy.url}/metrics", headers=AUTH).text
    assert "agl_proxy_stale_endpoints 1.0" in metrics

    # The trainer's push brought it to version 3: it takes its share again.
    await client.register_models([endpoint(second, version=3)])
    deadline = time.monotonic() + 10
    while "agl_proxy_stale_endpoints 0.0" not in httpx.get(f"{proxy.url}/metrics", headers=AUTH).text:
        assert time.monotonic() < deadline, "the proxy never saw the second engine's new version"
        await asyncio.sleep(0.02)
    assert all(r.status_code == 200 for r in await asyncio.gather(*(call(proxy, r) for r in rollouts)))
    used = {(await endpoints_used(client, r))[-1] for r in rollouts}
    assert used == {f"{first.url}/v1", f"{second.url}/v1"}


def test_the_routing_table_ranks_only_the_current_version() -> None:
    table = RoutingTable(MODEL)
    table.update([Endpoint("http://a/v1", 2), Endpoint("http://b/v1", 1), Endpoint("http://c/v1", 2)])
    assert {e.url for e in table.ranked("ro-1")} == {"http://a/v1", "http://c/v1"}
    assert table.stale == (Endpoint("http://b/v1", 1),) and len(table.endpoints) == 3
    table.update([Endpoint("http://b/v1", 1)])
    assert table.ranked("ro-1") == [Endpoint("http://b/v1", 1)] and table.stale == ()
    table.update([])
    assert table.ranked("ro-1") == [] and table.stale == ()
