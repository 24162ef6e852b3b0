"""Issue 30's second probe against real proxy processes (ledger and stand-in engine on loopback): what an agent or a
master-key caller sends must give a clear 4xx or a bound, never a 500 or an unbounded /metrics."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import re
import socket
import threading
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from services._gen.agl.v1 import event_pb2
from services.client import agent_token
from services.proxy.events.checks import MAX_DATA_DEPTH
from tests.support.procs import ServiceProcess

from .conftest import AUTH, KEY, MODEL, Http, base_url, event_url, new_rollout, run_proxy


@pytest.fixture(scope="module")
def own_proxy(ledger: ServiceProcess, engine: Http) -> Iterator[Http]:
    """A proxy of this module only, so that its counters hold this module's events alone."""
    with run_proxy(ledger.address) as process:
        yield process


def _agent(rollout_id: str) -> dict[str, str]:
    return {"authorization": f"Bearer {agent_token(KEY, rollout_id, 'at-1')}"}


def _event_counts(proxy: Http) -> dict[str, float]:
    text = httpx.get(f"{proxy.url}/metrics").text
    [family] = [f for f in text_string_to_metric_families(text) if f.name == "agl_proxy_agent_events"]
    return {s.labels["event_type"]: s.value for s in family.samples if s.name.endswith("_total")}


# -- finding 5: the agent-chosen event type as a metric label -------------------------------------------------------


async def test_event_types_an_agent_invents_do_not_grow_the_metrics_without_bound(own_proxy, client) -> None:
    rollout = await new_rollout(client)
    invented = [f"type-{i}" for i in range(60)] + ["bad\x00nul", "x" * 100_000, "sp ace", "ünï"]
    with httpx.Client(headers=_agent(rollout)) as http:
        for event_type in [*invented, "reward"]:
            body = {"event_type": event_type, "data": {"value": 1.0} if event_type == "reward" else {}}
            assert http.post(event_url(own_proxy, rollout), json=body).status_code == 200
    counts = _event_counts(own_proxy)
    assert counts["reward"] == 1
    kept = {label for label in counts if label not in ("reward", "other")}
    assert kept == {f"type-{i}" for i in range(32)}  # the first name-like types seen, then "other"
    assert counts["other"] == len(invented) - 32
    assert all(len(label) <= 64 and re.fullmatch(r"[A-Za-z0-9_.:-]+", label) for label in counts)
    events = await client.list_events(rollout)
    assert [e.event_type for e in events] == [*invented, "reward"]  # stored as given all the same
    size = len(httpx.get(f"{own_proxy.url}/metrics").content)
    for i in range(200):  # many more invented types: the page stays the same size
        body = {"event_type": f"more-{i}", "data": {}}
        assert httpx.post(event_url(own_proxy, rollout), json=body, headers=_agent(rollout)).status_code == 200
    assert len(httpx.get(f"{own_proxy.url}/metrics").content) < size + 200
    assert _event_counts(own_proxy)["other"] == len(invented) - 32 + 200


# -- finding 8: lone surrogates in an agent's event ------------------------------------------------------------------

SURROGATE = "\\udc80"  # as JSON text: an escape that decodes to a lone surrogate, which no UTF-8 string can hold


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (f'{{"event_type": "note{SURROGATE}", "data": {{}}}}', "`event_type`"),
        (f'{{"event_type": "note", "event_id": "id-{SURROGATE}", "data": {{}}}}', "`event_id`"),
        (f'{{"event_type": "reward", "data": {{"value": 1, "message": "{SURROGATE}"}}}}', "`data.message`"),
        (f'{{"event_type": "reward", "data": {{"value": 1, "source": "a{SURROGATE}"}}}}', "`data.source`"),
        (f'{{"event_type": "reward", "data": {{"value": 1, "reason": "{SURROGATE}"}}}}', "`data.reason`"),
        (f'{{"event_type": "note", "data": {{"text": "{SURROGATE}"}}}}', "`data`"),
    ],
)
async def test_a_lone_surrogate_in_an_event_is_422_naming_the_field(proxy, client, body: str, field: str) -> None:
    rollout = await new_rollout(client)
    headers = {**_agent(rollout), "content-type": "application/json"}
    reply = httpx.post(event_url(proxy, rollout), content=body.encode(), headers=headers)
    assert reply.status_code == 422, reply.text
    error = reply.json()["error"]
    assert error["code"] == "invalid_event" and field in error["message"] and "surrogate" in error["message"]
    stored = await client.list_events(rollout)
    assert [e.event_type for e in stored] == ["proxy_refused_event"]  # the refusal, noted on the rollout
    listed = httpx.get(f"{proxy.url}/api/rollouts/{rollout}/events", headers=AUTH)
    assert listed.status_code == 200 and listed.json()[0]["data"]["code"] == "invalid_event"


# -- finding 9: deeply nested data and v1.0's event listing ----------------------------------------------------------


def _nested_note(depth: int) -> bytes:
    """A note whose data (an object, as v1.0's events have) nests `depth` levels."""
    return b'{"event_type": "note", "data": {"a": ' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}}"


async def test_data_too_deep_for_the_v1_listing_is_refused_at_write_and_the_listing_answers(proxy, client) -> None:
    rollout = await new_rollout(client)
    headers = {**_agent(rollout), "content-type": "application/json"}
    for depth in (MAX_DATA_DEPTH + 1, 256, 600):
        reply = httpx.post(event_url(proxy, rollout), content=_nested_note(depth), headers=headers)
        assert reply.status_code == 422, reply.text
        assert f"nested more than {MAX_DATA_DEPTH} levels" in reply.json()["error"]["message"]
    reply = httpx.post(event_url(proxy, rollout), content=_nested_note(MAX_DATA_DEPTH), headers=headers)
    assert reply.status_code == 200, reply.text
    listed = httpx.get(f"{proxy.url}/api/rollouts/{rollout}/events", headers=AUTH)
    assert listed.status_code == 200, listed.text
    data = listed.json()[-1]["data"]["a"]
    for _ in range(MAX_DATA_DEPTH - 2):
        (data,) = data
    assert data == []  # read back whole


async def test_the_v1_listing_answers_for_whatever_the_ledger_holds(proxy, client) -> None:
    """Events no agent can post now but a master-key writer (or an older proxy) could store: data nested 600 deep, a
    lone surrogate, an integer past 64 bits. The listing is 200, with what JSON cannot carry cut, never a 500."""
    rollout = await new_rollout(client)
    deep = "[" * 600 + "]" * 600
    texts = [deep, f'{{"t": "a{SURROGATE}"}}', '{"n": 123456789012345678901234567890, "x": NaN}']
    await client.append_events([event_pb2.Event(rollout_id=rollout, event_type="note", data_json=t) for t in texts])
    listed = httpx.get(f"{proxy.url}/api/rollouts/{rollout}/events", headers=AUTH)
    assert listed.status_code == 200, listed.text
    deep_data, text_data, number_data = (item["data"] for item in listed.json())
    for _ in range(252):
        (deep_data,) = deep_data
    assert isinstance(deep_data, str) and "nested too deeply" in deep_data
    assert text_data == {"t": "a\\udc80"}
    assert number_data["n"] == pytest.approx(1.2345678901234568e29) and number_data["x"] is None
    assert len(await client.list_events(rollout)) == 3  # stored unchanged


# -- finding 13: out-of-range numbers on master-key routes -----------------------------------------------------------


@pytest.mark.parametrize("after", [str(2**63), str(10**30), "9" * 5000, str(-(2**63) - 1)])
async def test_an_out_of_range_terminal_cursor_is_a_clear_4xx(proxy, after: str) -> None:
    reply = httpx.get(f"{proxy.url}/api/rollouts/terminal", params={"after": after}, headers=AUTH)
    assert reply.status_code == 422, reply.text
    assert "after" in reply.json()["detail"]


async def test_the_largest_terminal_cursor_reaches_the_ledger_and_gets_its_answer(proxy) -> None:
    reply = httpx.get(f"{proxy.url}/api/rollouts/terminal", params={"after": str(2**63 - 1)}, headers=AUTH)
    assert reply.status_code == 422, reply.text
    assert "ahead of the terminal log" in reply.json()["detail"]


@pytest.mark.parametrize("route", ["pause", "drain"])
@pytest.mark.parametrize("value", [1e300, 2**31, 86_401, -1])
async def test_an_out_of_range_retry_after_is_400_and_pauses_nothing(proxy, route: str, value: float) -> None:
    reply = httpx.post(f"{proxy.url}/admin/{route}", json={"retry_after_seconds": value}, headers=AUTH)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["code"] == "invalid_request" and "retry_after_seconds" in error["message"]
    assert httpx.get(f"{proxy.url}/admin/state", headers=AUTH).json()["paused"] is False


async def test_the_longest_retry_after_is_accepted(proxy) -> None:
    reply = httpx.post(f"{proxy.url}/admin/pause", json={"retry_after_seconds": 86_400}, headers=AUTH)
    try:
        assert reply.status_code == 200, reply.text
        assert reply.json()["retry_after_seconds"] == 86_400
    finally:
        assert httpx.post(f"{proxy.url}/admin/resume", headers=AUTH).status_code == 200


# -- finding 17: connections that never authenticate against the agents' idle ones --------------------------------

FLOOD_CAP = 64
AGENTS = 8
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "What is 2 + 2?"}]}


@pytest.fixture(scope="module")
def capped_proxy(ledger: ServiceProcess, engine: Http) -> Iterator[Http]:
    with run_proxy(ledger.address, args=["--max-client-connections", str(FLOOD_CAP), "--header-timeout", "5"]) as p:
        yield p


async def test_a_flood_of_anonymous_connections_does_not_push_out_the_agents(capped_proxy, client) -> None:
    """The probe opened ~1,000 connections/s that send nothing against a cap of 64: each new one displaced the
    connection waiting longest, which was an agent's idle keep-alive one, and 53% of the agents' calls failed.
    A connection whose caller's key was accepted is now displaced only when nothing else can go."""
    rollouts = [await new_rollout(client) for _ in range(AGENTS)]
    host, port = capped_proxy.url.removeprefix("http://").rsplit(":", 1)
    stop = threading.Event()
    opened = [0]
    held: collections.deque[socket.socket] = collections.deque()

    def flood() -> None:
        """As fast as one thread connects (thousands a second here): each connection sends nothing. The newest 500
        are held open (more than the cap; the proxy has closed the older ones by then)."""
        while not stop.is_set():
            with contextlib.suppress(OSError):
                held.append(socket.create_connection((host, int(port)), timeout=1))
                opened[0] += 1
            while len(held) > 500:
                held.popleft().close()

    async def agent(rollout_id: str) -> tuple[int, list[str]]:
        done, failures = 0, []
        url = f"{base_url(capped_proxy, rollout_id)}/chat/completions"
        async with httpx.AsyncClient(timeout=10, limits=httpx.Limits(max_connections=1)) as http:
            await http.post(url, json=CHAT, headers=_agent(rollout_id))  # the connection is made before the flood
            await flooding.wait()
            while not stop.is_set():
                try:
                    reply = await http.post(url, json=CHAT, headers=_agent(rollout_id))
                    if reply.status_code != 200:
                        failures.append(f"{reply.status_code} {reply.text[:80]}")
                except httpx.HTTPError as err:
                    failures.append(type(err).__name__)
                done += 1
                await asyncio.sleep(0.3)  # an agent thinks between calls (a tool runs): its connection sits idle
        return done, failures

    flooding = asyncio.Event()
    agents = [asyncio.create_task(agent(r)) for r in rollouts]
    await asyncio.sleep(0.5)
    flooder = threading.Thread(target=flood, daemon=True)
    flooder.start()
    flooding.set()
    await asyncio.sleep(5.0)
    stop.set()
    results = await asyncio.gather(*agents)
    flooder.join()
    flood_count = opened[0]
    for sock in held:
        sock.close()
    calls = sum(done for done, _ in results)
    failures = [f for _, fails in results for f in fails]
    print(
        f"flood: {flood_count} anonymous connections in 5 s, cap {FLOOD_CAP}: {len(failures)} of {calls} calls failed"
    )
    assert flood_count > 1000, flood_count  # the flood really was one
    assert calls >= AGENTS * 5, calls
    assert failures == [], failures[:5]
