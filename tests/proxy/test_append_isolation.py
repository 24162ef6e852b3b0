"""Issue 30 finding 1, black-box: one agent cannot get other agents' events refused or lost (real ledger, proxy and
stand-in engine on loopback).

The proxy's ledger client merges concurrent appends of many agents into one AppendEvents request. The probe saw
one agent, with only its own token and rollout, re-post an event id it had used with different data: each merged
request it was in was refused as a whole, and the other agents got its 409 (naming its rollout) for their rewards
and, after the engine had answered, for their model calls, none of which were stored.
"""

from __future__ import annotations

import asyncio
import collections
import itertools

import httpx

from services.client import agent_token

from .conftest import KEY, MODEL, base_url, event_url, new_rollout

AGENTS = 8
ROUNDS = 12
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "What is 2 + 2?"}]}


def _auth(rollout_id: str) -> dict[str, str]:
    return {"authorization": f"Bearer {agent_token(KEY, rollout_id, 'at-1')}"}


async def test_an_agent_reposting_conflicting_event_ids_costs_other_agents_nothing(proxy, client) -> None:
    bad = await new_rollout(client)
    good = [await new_rollout(client) for _ in range(AGENTS)]
    statuses: dict[str, collections.Counter[int]] = {rid: collections.Counter() for rid in good}
    refusals: list[str] = []
    done = asyncio.Event()
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=64)) as http:
        first = {"event_type": "note", "event_id": "reused", "data": {"n": 0}}
        assert (await http.post(event_url(proxy, bad), json=first, headers=_auth(bad))).status_code == 200

        async def misbehave(counter: itertools.count[int]) -> None:
            while not done.is_set():
                body = {"event_type": "note", "event_id": "reused", "data": {"n": next(counter)}}
                reply = await http.post(event_url(proxy, bad), json=body, headers=_auth(bad))
                assert reply.status_code == 409, reply.text
                refusals.append(reply.json()["error"]["message"])

        async def behave(rid: str) -> None:
            for k in range(ROUNDS):
                url = f"{base_url(proxy, rid)}/chat/completions"
                statuses[rid][(await http.post(url, json=CHAT, headers=_auth(rid))).status_code] += 1
                note = {"event_type": "note", "event_id": f"note-{k}", "data": {"k": k}}
                statuses[rid][(await http.post(event_url(proxy, rid), json=note, headers=_auth(rid))).status_code] += 1
                reward = {"event_type": "reward", "data": {"value": float(k)}}
                reply = await http.post(event_url(proxy, rid), json=reward, headers=_auth(rid))
                statuses[rid][reply.status_code] += 1

        counter = itertools.count(1)
        bad_agents = [asyncio.create_task(misbehave(counter)) for _ in range(AGENTS)]
        try:
            await asyncio.gather(*(behave(rid) for rid in good))
        finally:
            done.set()
            await asyncio.gather(*bad_agents)
    assert refusals, "the misbehaving agent's conflicting posts were refused"
    assert all(bad in message and "reused" in message for message in refusals)
    assert statuses == {rid: collections.Counter({200: 3 * ROUNDS}) for rid in good}
    for rid in good:
        events = await client.list_events(rid)
        kinds = collections.Counter(e.event_type for e in events)
        assert kinds == {"model_request": ROUNDS, "note": ROUNDS, "reward": ROUNDS}, kinds
        assert [e.reward.value for e in events if e.event_type == "reward"] == [float(k) for k in range(ROUNDS)]
    assert [e.data_json for e in await client.list_events(bad)] == ['{"n": 0}']
