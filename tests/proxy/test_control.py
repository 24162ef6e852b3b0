"""Pause, resume and drain across two proxy processes that share one ledger."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest

from services.client import LedgerClient
from tests.support.procs import ServiceProcess

from .conftest import AUTH, MODEL, Http, base_url, new_rollout, run_proxy

SLOW = {"model": MODEL, "messages": [{"role": "user", "content": "What is 3 + 3?"}], "standin": {"delay_ms": 1500}}
FAST = {"model": MODEL, "messages": [{"role": "user", "content": "What is 3 + 3?"}]}


@pytest.fixture(scope="module")
def proxies(ledger: ServiceProcess, engine: Http) -> Iterator[tuple[Http, Http]]:
    with run_proxy(ledger.address) as first, run_proxy(ledger.address) as second:
        yield first, second


@pytest.fixture(autouse=True)
def resumed(proxies: tuple[Http, Http]) -> Iterator[None]:
    yield
    httpx.post(f"{proxies[0].url}/admin/resume", headers=AUTH).raise_for_status()


async def chat(http: httpx.AsyncClient, proxy: Http, rollout_id: str, body: dict) -> httpx.Response:
    return await http.post(f"{base_url(proxy, rollout_id)}/chat/completions", json=body)


async def wait_state(proxy: Http, predicate, timeout_s: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        state = httpx.get(f"{proxy.url}/admin/state", headers=AUTH).json()
        if predicate(state):
            return state
        assert time.monotonic() < deadline, f"state never matched: {state}"
        await asyncio.sleep(0.02)


async def wait_paused_everywhere(proxies: tuple[Http, ...], paused: bool) -> None:
    deadline = time.monotonic() + 10
    while any(httpx.get(f"{p.url}/status").json()["paused"] != paused for p in proxies):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)


async def test_pause_on_one_replica_refuses_calls_on_both_with_retry_after(proxies, client: LedgerClient) -> None:
    first, second = proxies
    rollout_id = await new_rollout(client)
    paused = httpx.post(
        f"{first.url}/admin/pause", json={"retry_after_seconds": 7, "reason": "weight update"}, headers=AUTH
    )
    assert paused.status_code == 200 and paused.json()["paused"] is True
    await wait_paused_everywhere(proxies, True)
    async with httpx.AsyncClient(headers=AUTH, timeout=30) as http:
        for proxy in proxies:
            refused = await chat(http, proxy, rollout_id, FAST)
            assert refused.status_code == 429 and refused.headers["retry-after"] == "7"
            assert (
                refused.json()["error"]["type"] == "rate_limit_error"
                and "weight update" in refused.json()["error"]["message"]
            )
        reward = {"event_type": "reward", "data": {"value": 1}}  # rewards are still taken while paused
        assert (
            await http.post(f"{second.url}/api/rollouts/{rollout_id}/attempt/at-1/events", json=reward)
        ).status_code == 200
        state = httpx.get(f"{second.url}/admin/state", headers=AUTH).json()
        assert state["paused"] and state["reason"] == "weight update" and len(state["replicas"]) == 2
        assert httpx.post(f"{second.url}/admin/resume", headers=AUTH).json()["paused"] is False
        await wait_paused_everywhere(proxies, False)
        for proxy in proxies:
            assert (await chat(http, proxy, rollout_id, FAST)).status_code == 200
    assert [e.event_type for e in await client.list_events(rollout_id)] == ["reward", "model_request", "model_request"]


async def test_drain_waits_for_calls_in_flight_on_every_replica(proxies, client: LedgerClient) -> None:
    first, second = proxies
    rollouts = [await new_rollout(client) for _ in range(4)]
    async with httpx.AsyncClient(headers=AUTH, timeout=30) as http:
        slow = [asyncio.ensure_future(chat(http, proxies[i % 2], r, SLOW)) for i, r in enumerate(rollouts)]
        state = await wait_state(
            first, lambda s: s["in_flight"] == 4 and all(r["in_flight"] == 2 for r in s["replicas"])
        )
        assert len(state["replicas"]) == 2
        drain = await http.post(f"{second.url}/admin/drain", json={"timeout_seconds": 20, "retry_after_seconds": 2})
        result = drain.json()
        assert drain.status_code == 200 and result["drained"] is True and result["in_flight"] == 0
        assert result["waited_seconds"] > 0 and result["paused"] is True
        # Drained means finished and recorded: every slow call has its event in the ledger already.
        for rollout_id in rollouts:
            assert [e.event_type for e in await client.list_events(rollout_id)] == ["model_request"]
        for task in slow:
            assert (await task).status_code == 200
        assert (await chat(http, first, rollouts[0], FAST)).status_code == 429


async def test_drain_times_out_when_a_call_outlasts_it(proxies, client: LedgerClient) -> None:
    first, second = proxies
    rollout_id = await new_rollout(client)
    async with httpx.AsyncClient(headers=AUTH, timeout=30) as http:
        slow = asyncio.ensure_future(chat(http, first, rollout_id, SLOW))
        await wait_state(second, lambda s: s["in_flight"] == 1)
        result = (await http.post(f"{second.url}/admin/drain", json={"timeout_seconds": 0.2})).json()
        assert result["drained"] is False and result["in_flight"] == 1
        assert (await slow).status_code == 200  # a call already running is never cut by a pause
        final = (await http.post(f"{second.url}/admin/drain", json={"timeout_seconds": 10})).json()
        assert final["drained"] is True


def _metric(proxy: Http, sample: str) -> float:
    """The value of one sample line of the proxy's /metrics, such as 'agl_proxy_in_flight'."""
    for line in httpx.get(f"{proxy.url}/metrics").text.splitlines():
        name, _, value = line.rpartition(" ")
        if name == sample:
            return float(value)
    return 0.0


async def test_metrics_show_calls_in_flight_and_count_them_by_outcome(proxies, client: LedgerClient) -> None:
    first = proxies[0]
    ok = 'agl_proxy_model_calls_total{api="chat.completions",outcome="ok"}'
    timed = 'agl_proxy_model_call_seconds_count{api="chat.completions"}'
    appended = "agl_proxy_ledger_append_seconds_count"
    before = {name: _metric(first, name) for name in (ok, timed, appended)}
    rollouts = [await new_rollout(client) for _ in range(3)]
    async with httpx.AsyncClient(headers=AUTH, timeout=30) as http:
        slow = [asyncio.ensure_future(chat(http, first, r, SLOW)) for r in rollouts]
        deadline = time.monotonic() + 10
        while _metric(first, "agl_proxy_in_flight") != 3:
            assert time.monotonic() < deadline, "agl_proxy_in_flight never showed the 3 calls"
            await asyncio.sleep(0.02)
        assert [response.status_code for response in await asyncio.gather(*slow)] == [200, 200, 200]
    assert _metric(first, "agl_proxy_in_flight") == 0
    assert {name: _metric(first, name) - before[name] for name in before} == {ok: 3, timed: 3, appended: 3}
