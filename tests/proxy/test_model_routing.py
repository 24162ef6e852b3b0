"""Several runs on one proxy and one engine (issue 32 item 3): each rollout is routed to the model its `agl_model`
label names (a run's adapter), a rollout without it to the proxy's own model, and a pause of one model (a run's weight
update) holds only that model's calls while the other run's go on.

Real ledger, real proxy; one stand-in engine serving its base model and two runs' adapters (vLLM's --lora-modules,
GET /v1/models with each adapter's path, POST /v1/load_lora_adapter), and one serving the proxy's own model."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from services._gen.agl.v1 import model_pb2, rollout_pb2
from services.client import LedgerClient
from services.proxy.engines.model_tables import MODEL_LABEL, ModelRoutes
from services.proxy.engines.routing import Endpoint
from tests.support.procs import ServiceProcess

from .conftest import AUTH, MODEL, Http, base_url, run_proxy, run_standin

ADAPTERS = "run-a=/w/a/adapter-v1,run-b=/w/b/adapter-v3"


@pytest.fixture(scope="module")
def engines() -> Iterator[tuple[Http, Http]]:
    """The shared engine (base model plus both runs' adapters), and an engine of the proxy's own model."""
    with run_standin("base", ["--lora-modules", ADAPTERS]) as shared, run_standin() as own:
        yield shared, own


@pytest.fixture(scope="module")
def proxy(ledger: ServiceProcess, engines: tuple[Http, Http]) -> Iterator[Http]:
    args = ["--engine-check-seconds", "0.2", "--engine-wait-seconds", "0.5"]
    with run_proxy(ledger.address, args=args) as process:
        yield process


def endpoint(model: str, engine: Http, version: int, label: str = "") -> model_pb2.ModelEndpoint:
    return model_pb2.ModelEndpoint(model_name=model, endpoint=f"{engine.url}/v1", version=version, weight_label=label)


async def rollout(client: LedgerClient, model: str = "") -> str:
    """A running rollout of `model` (labelled as the trainer labels its run's rollouts; "": unlabelled)."""
    rollout_id = f"ro-{model or 'own'}-{time.monotonic_ns()}"
    labels = {MODEL_LABEL: model} if model else {}
    spec = rollout_pb2.RolloutSpec(
        rollout_id=rollout_id, input_json="{}", is_train=True, metadata=rollout_pb2.RolloutMetadata(labels=labels)
    )
    await client.create_rollouts([spec])
    await client.update_status(rollout_id, rollout_pb2.ROLLOUT_STATE_RUNNING, attempt_id="at-1")
    return rollout_id


async def call(proxy: Http, rollout_id: str, delay_ms: int = 0) -> httpx.Response:
    body = {"model": "whatever-the-agent-says", "messages": [{"role": "user", "content": "What is 2 + 3?"}]}
    if delay_ms:
        body["standin"] = {"delay_ms": delay_ms}
    async with httpx.AsyncClient(headers=AUTH, timeout=30) as http:
        return await http.post(f"{base_url(proxy, rollout_id)}/chat/completions", json=body)


async def recorded(client: LedgerClient, rollout_id: str) -> list[tuple[str, int, str, int]]:
    """(model, version, endpoint, HTTP status) of each call the proxy recorded for the rollout."""
    events = await client.list_events(rollout_id, event_type="model_request")
    return [(e.model_request.model, e.model_request.model_version, e.model_request.endpoint,
             e.model_request.http_status) for e in events]  # fmt: skip


async def until(what: str, condition: Callable[[], bool], timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)


def status(proxy: Http) -> dict:
    return httpx.get(f"{proxy.url}/status").json()


def admin(proxy: Http, path: str, body: dict) -> dict:
    reply = httpx.post(f"{proxy.url}/admin/{path}", json=body, headers=AUTH, timeout=30)
    reply.raise_for_status()
    return reply.json()


def test_each_model_keeps_its_own_table_and_holds() -> None:
    routes = ModelRoutes("own")
    shared = "http://shared/v1"
    routes.update([("a", Endpoint(shared, 1)), ("b", Endpoint(shared, 3)), ("b", Endpoint("http://old/v1", 2))], 7)
    assert [t.model_name for t in routes.tables] == ["own", "a", "b"] and routes.revision == 7
    assert routes.table().endpoints == () and routes.table("nobody").ranked("ro") == []
    assert routes.table("b").ranked("ro") == [Endpoint(shared, 3)]  # its own newest version, not a's
    assert routes.table("b").hold(shared, "adapter missing")
    assert routes.table("a").ranked("ro") == [Endpoint(shared, 1)] and routes.count() == (3, 1, 1)
    routes.update([("a", Endpoint(shared, 2)), ("b", Endpoint(shared, 4))], 8)  # b's hold outlives its push
    assert routes.table("b").held == {shared: "adapter missing"} and routes.table("a").ranked("ro") == [
        Endpoint(shared, 2)
    ]
    routes.update([("a", Endpoint(shared, 2))], 9)
    assert [t.model_name for t in routes.tables] == ["own", "a"] and routes.table("b").held == {}


async def test_each_rollout_is_served_by_its_own_runs_model_and_a_pause_of_one_run_holds_only_its_calls(
    proxy: Http, engines: tuple[Http, Http], client: LedgerClient
) -> None:
    shared, own = engines
    await client.register_models([
        endpoint("run-a", shared, 1, "adapter:/w/a/adapter-v1"),
        endpoint("run-b", shared, 3, "adapter:/w/b/adapter-v3"),
        endpoint(MODEL, own, 1),
    ])  # fmt: skip
    await until("every model routed", lambda: {"run-a", "run-b", MODEL} <= set(status(proxy)["models"]))
    a = [await rollout(client, "run-a") for _ in range(4)]
    b = [await rollout(client, "run-b") for _ in range(4)]
    plain = await rollout(client)
    nobody = await rollout(client, "run-c")
    replies = await asyncio.gather(*(call(proxy, r) for r in [*a, *b, plain]))
    assert [r.status_code for r in replies] == [200] * 9, [r.text for r in replies]
    assert {r.json()["model"] for r in replies[:4]} == {"run-a"} and {r.json()["model"] for r in replies[4:8]} == {
        "run-b"
    }
    for rollout_id in a:
        assert await recorded(client, rollout_id) == [("run-a", 1, f"{shared.url}/v1", 200)]
    for rollout_id in b:
        assert await recorded(client, rollout_id) == [("run-b", 3, f"{shared.url}/v1", 200)]
    # A rollout without the label goes to the proxy's own model, as in v1.0; one naming an unregistered model nowhere.
    assert await recorded(client, plain) == [(MODEL, 1, f"{own.url}/v1", 200)]
    # The model list an agent reads names the model its rollout is routed to.
    async with httpx.AsyncClient(headers=AUTH, timeout=30) as http:
        listed = [(await http.get(f"{base_url(proxy, r)}/models")).json()["data"] for r in (a[0], b[0], plain)]
    assert [[card["id"] for card in data] for data in listed] == [["run-a"], ["run-b"], [MODEL]], listed
    unrouted = await call(proxy, nobody)
    assert unrouted.status_code == 503 and "No engine endpoint is registered for model run-c" in unrouted.text

    # Run b's weight update: a drain of run-b waits for b's call in flight only, not for a's slower one.
    slow_a = asyncio.create_task(call(proxy, a[0], delay_ms=4000))
    slow_b = asyncio.create_task(call(proxy, b[0], delay_ms=1000))
    await until("both calls in flight", lambda: status(proxy)["in_flight"] == 2)
    body = {"model": "run-b", "timeout_seconds": 10, "reason": "step 4 weight update", "owner": "trainer:b"}
    drained = await asyncio.to_thread(admin, proxy, "drain", body)
    assert drained["drained"] and 0.5 < drained["waited_seconds"] < 3.5, drained
    assert (await slow_b).status_code == 200 and not slow_a.done()
    assert drained["model_pauses"] == [
        {"model": "run-b", "reason": "step 4 weight update", "owner": "trainer:b", "retry_after_seconds": 5}
    ]
    assert not drained["paused"] and drained["in_flight"] == 1
    # While b is paused: b's calls are refused with 429, a's (and the proxy's own) are served.
    refused = await call(proxy, b[1])
    assert refused.status_code == 429 and refused.headers["retry-after"] == "5" and "run-b" in refused.text
    assert (await call(proxy, a[1])).status_code == 200 and (await call(proxy, plain)).status_code == 200
    # b's push: the engine loads b's next adapter in place and the trainer registers it.
    load = {"lora_name": "run-b", "lora_path": "/w/b/adapter-v4", "load_inplace": True}
    httpx.post(f"{shared.url}/v1/load_lora_adapter", json=load).raise_for_status()
    await client.register_models([endpoint("run-b", shared, 4, "adapter:/w/b/adapter-v4")])
    assert not (await asyncio.to_thread(admin, proxy, "resume", {"model": "run-b"}))["model_pauses"]
    assert (await slow_a).status_code == 200
    await until("b routed at version 4", lambda: status(proxy)["models"]["run-b"]["held_back"] == {})
    assert (await call(proxy, b[1])).status_code == 200
    assert (await recorded(client, b[1]))[-1] == ("run-b", 4, f"{shared.url}/v1", 200)
    # Run a saw only its own adapter, at its own version, before, during and after b's update.
    assert {entry for r in a for entry in await recorded(client, r)} == {("run-a", 1, f"{shared.url}/v1", 200)}


async def test_an_engine_is_held_back_for_the_run_whose_adapter_it_lacks_and_serves_the_other(
    proxy: Http, engines: tuple[Http, Http], client: LedgerClient
) -> None:
    shared, _ = engines
    # b is registered at a version whose adapter the engine has not loaded (a push under way, or a restart).
    await client.register_models([endpoint("run-b", shared, 5, "adapter:/w/b/adapter-v5")])
    url = f"{shared.url}/v1"
    await until("b held back", lambda: url in status(proxy)["models"]["run-b"]["held_back"])
    assert status(proxy)["models"]["run-a"]["held_back"] == {}
    a, b = await rollout(client, "run-a"), await rollout(client, "run-b")
    assert (await call(proxy, a)).status_code == 200
    held = await call(proxy, b)
    assert held.status_code == 503 and "engine_not_current" in held.text and "run-b" in held.text
    load = {"lora_name": "run-b", "lora_path": "/w/b/adapter-v5", "load_inplace": True}
    httpx.post(f"{shared.url}/v1/load_lora_adapter", json=load).raise_for_status()
    await until("b released", lambda: status(proxy)["models"]["run-b"]["held_back"] == {})
    assert (await call(proxy, b)).status_code == 200
    assert (await recorded(client, b))[-1] == ("run-b", 5, url, 200)
