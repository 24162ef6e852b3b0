"""The proxy reads each engine's own weight label and holds back one that disagrees with the registry (restarted
from its base model) or refuses connections, until it agrees again (services/proxy/engines/weight_check.py, issue 29).

Real ledger, real proxy, stand-in engines serving vLLM's dev-mode label routes (`--weight-version`)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import httpx
import pytest

from services._gen.agl.v1 import model_pb2
from services.client import LedgerClient
from services.proxy.engines.routing import Endpoint, RoutingTable
from services.proxy.engines.weight_check import label_verdict
from tests.support.procs import ServiceProcess, free_port

from .conftest import AUTH, MODEL, Http, base_url, new_rollout, run_proxy, run_standin

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "What is 1 + 1?"}]}


@pytest.fixture(scope="module")
def proxy(ledger: ServiceProcess) -> Http:
    args = ["--retry-attempts", "2", "--engine-check-seconds", "0.2", "--engine-wait-seconds", "5"]
    with run_proxy(ledger.address, args=args) as process:
        yield process


def registered(engine: Http, version: int, label: str | None = None) -> model_pb2.ModelEndpoint:
    """An endpoint as the trainer's push registers it: at `version`, labelled with it (or `label`; "": by hand)."""
    label = str(version) if label is None else label
    return model_pb2.ModelEndpoint(model_name=MODEL, endpoint=f"{engine.url}/v1", version=version, weight_label=label)


async def only(client: LedgerClient, *endpoints: model_pb2.ModelEndpoint) -> None:
    await client.delete_models([model_pb2.ModelEndpointKey(model_name=MODEL)])
    await client.register_models(list(endpoints))


def status(proxy: Http) -> dict:
    return httpx.get(f"{proxy.url}/status").json()


async def until(what: str, condition: Callable[[], bool], timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)


async def call(proxy: Http, rollout_id: str) -> httpx.Response:
    async with httpx.AsyncClient(headers=AUTH, timeout=30) as http:
        return await http.post(f"{base_url(proxy, rollout_id)}/chat/completions", json=CHAT)


def set_label(engine: Http, label: str) -> None:
    httpx.post(f"{engine.url}/update_weight_version", json={"new_version": label}).raise_for_status()


def test_the_label_verdict() -> None:
    assert label_verdict("3", "3") is None and label_verdict("default", "") is None and label_verdict("7", "") is None
    assert label_verdict("default", "3") == "reports weights 'default', registered as '3'"
    assert label_verdict("4", "3") is not None


def test_a_hold_leaves_the_ranking_until_released_and_ends_with_its_registration() -> None:
    table = RoutingTable(MODEL)
    table.update([Endpoint("http://a/v1", 2), Endpoint("http://b/v1", 2)])
    assert table.hold("http://a/v1", "restarted") and not table.hold("http://a/v1", "restarted")
    assert not table.hold("http://zz/v1", "not registered")
    assert table.ranked("ro") == [Endpoint("http://b/v1", 2)] and table.held == {"http://a/v1": "restarted"}
    table.update([Endpoint("http://a/v1", 3), Endpoint("http://b/v1", 2)])  # re-registered: still held
    assert table.ranked("ro") == [] and table.held == {"http://a/v1": "restarted"}
    assert table.release("http://a/v1") and not table.release("http://a/v1")
    assert table.ranked("ro") == [Endpoint("http://a/v1", 3)]
    table.hold("http://a/v1", "restarted")
    table.update([Endpoint("http://b/v1", 2)])
    assert table.held == {} and table.ranked("ro") == [Endpoint("http://b/v1", 2)]


async def test_a_restarted_engine_is_held_back_until_it_serves_the_registered_weights(proxy, client) -> None:
    with (
        run_standin(args=["--weight-version", "3"]) as current,
        run_standin(args=["--weight-version", "default"]) as restarted,
    ):
        # The second engine restarted from its base model; the registry still lists it at the last push's version.
        await only(client, registered(current, 3), registered(restarted, 3))
        await until("the restarted engine held back", lambda: f"{restarted.url}/v1" in status(proxy)["held_back"])
        why = status(proxy)["held_back"][f"{restarted.url}/v1"]
        assert why == "reports weights 'default', registered as '3'", why
        assert "agl_proxy_held_endpoints 1.0" in httpx.get(f"{proxy.url}/metrics", headers=AUTH).text
        rollouts = [await new_rollout(client) for _ in range(12)]
        assert all(r.status_code == 200 for r in await asyncio.gather(*(call(proxy, r) for r in rollouts)))
        for rollout_id in rollouts:
            (event,) = await client.list_events(rollout_id, event_type="model_request")
            assert event.model_request.endpoint == f"{current.url}/v1"

        # The trainer's catch-up reloads it and labels it 3: it takes its share again.
        set_label(restarted, "3")
        await until("the caught-up engine released", lambda: status(proxy)["held_back"] == {})
        assert all(r.status_code == 200 for r in await asyncio.gather(*(call(proxy, r) for r in rollouts)))
        used = {(await client.list_events(r, event_type="model_request"))[-1].model_request.endpoint for r in rollouts}
        assert used == {f"{current.url}/v1", f"{restarted.url}/v1"}


async def test_with_every_engine_held_back_a_call_is_a_recorded_503_with_retry_after(proxy, client) -> None:
    with run_standin(args=["--weight-version", "default"]) as engine:
        await only(client, registered(engine, 5))
        await until("the engine held back", lambda: f"{engine.url}/v1" in status(proxy)["held_back"])
        rollout_id = await new_rollout(client)
        answer = await call(proxy, rollout_id)
        assert answer.status_code == 503 and answer.headers["retry-after"] == "2", answer.text
        error = answer.json()["error"]
        assert error["code"] == "engine_not_current" and f"{engine.url}/v1" in error["message"], error
        assert httpx.get(f"{engine.url}/standin/requests").json()["requests"] == 0  # nothing reached the engine
        (event,) = await client.list_events(rollout_id, event_type="model_request")
        assert event.model_request.http_status == 503  # the trainer files the agent's failure as the engine's
        assert json.loads(event.model_request.response_json)["error"]["code"] == "engine_not_current"

        set_label(engine, "5")
        await until("the engine released", lambda: status(proxy)["held_back"] == {})
        assert (await call(proxy, rollout_id)).status_code == 200


async def test_a_dead_engine_is_held_back_and_comes_back_only_at_the_registered_weights(proxy, client) -> None:
    port = free_port()
    with run_standin(args=["--weight-version", "2"], port=port) as engine, run_standin() as unlabelled:
        await only(client, registered(engine, 2), registered(unlabelled, 2))
        await until("both routed", lambda: len(status(proxy)["endpoints"]) == 2 and not status(proxy)["held_back"])
        engine.process.kill()
        await until("the dead engine held back", lambda: f"{engine.url}/v1" in status(proxy)["held_back"])
        assert status(proxy)["held_back"][f"{engine.url}/v1"].startswith("unreachable")
        # An engine without the label route is routed as registered: only its answering can be checked.
        assert f"{unlabelled.url}/v1" not in status(proxy)["held_back"]
        rollouts = [await new_rollout(client) for _ in range(6)]
        assert all(r.status_code == 200 for r in await asyncio.gather(*(call(proxy, r) for r in rollouts)))
        assert {(await client.list_events(r))[-1].model_request.endpoint for r in rollouts} == {f"{unlabelled.url}/v1"}

    # Restarted on the same port from its base model: answering is not enough, its label must say version 2.
    with run_standin(args=["--weight-version", "default"], port=port) as engine:
        await until(
            "the restarted engine seen", lambda: "reports" in status(proxy)["held_back"].get(f"{engine.url}/v1", "")
        )
        set_label(engine, "2")
        await until("the restarted engine released", lambda: f"{engine.url}/v1" not in status(proxy)["held_back"])


async def test_an_endpoint_registered_without_a_label_is_not_held_for_its_label(proxy, client) -> None:
    # Registered by hand (`agl models register`, compose's one-shot) at any version: what it reports is not known.
    with run_standin(args=["--weight-version", "default"]) as engine:
        await only(client, registered(engine, 3, label=""))
        await until("the endpoint seen", lambda: status(proxy)["endpoints"] == [f"{engine.url}/v1"])
        time.sleep(0.6)  # three checks
        assert status(proxy)["held_back"] == {}
        assert (await call(proxy, await new_rollout(client))).status_code == 200


async def test_an_engine_check_of_0_routes_as_registered(ledger: ServiceProcess, client) -> None:
    checks_off = run_proxy(ledger.address, args=["--engine-check-seconds", "0"])
    with checks_off as unchecked, run_standin(args=["--weight-version", "default"]) as engine:
        await only(client, registered(engine, 4))
        await until("the endpoint seen", lambda: status(unchecked)["endpoints"] == [f"{engine.url}/v1"])
        time.sleep(0.5)
        assert status(unchecked)["held_back"] == {}
        assert (await call(unchecked, await new_rollout(client))).status_code == 200


async def test_a_call_made_while_the_only_engine_restarts_waits_for_it_and_is_recorded_once(proxy, client) -> None:
    port = free_port()
    with run_standin(args=["--weight-version", "1"], port=port) as engine:
        await only(client, registered(engine, 1))
        await until(
            "routed", lambda: status(proxy)["endpoints"] == [f"{engine.url}/v1"] and not status(proxy)["held_back"]
        )
        engine.process.kill()
    rollout_id = await new_rollout(client)
    started = time.monotonic()
    pending = asyncio.ensure_future(call(proxy, rollout_id))
    await asyncio.sleep(1.0)
    assert not pending.done()  # waiting for an engine, not failed
    # Back on the same port, and caught up (labelled 1) by the trainer.
    with run_standin(args=["--weight-version", "1"], port=port):
        answer = await pending
        waited = time.monotonic() - started
    assert answer.status_code == 200, answer.text
    print(f"the call waited {waited:.1f}s for the restarted engine")
    (event,) = await client.list_events(rollout_id, event_type="model_request")  # the answer only, no failure
    assert event.model_request.http_status == 200
