"""A reward posted under a near-miss event type is refused loudly (422 naming "reward", a warning event on the
rollout), never stored silently as another type."""

from __future__ import annotations

import json

import httpx
import pytest

from services.client import LedgerClient

from .conftest import AUTH, event_url, new_rollout

NEAR_MISSES = ["rewrd", "Reward", "REWARD", "rewards", " reward", "rewrad", "re-ward", "reward_"]
OTHER_TYPES = ["final_reward", "rewind", "progress", "award", "rewarded"]


@pytest.mark.parametrize("event_type", NEAR_MISSES)
async def test_near_miss_of_reward_is_422_naming_the_spelling_and_stores_nothing(
    proxy, client: LedgerClient, event_type: str
) -> None:
    rollout_id = await new_rollout(client)
    reply = httpx.post(
        event_url(proxy, rollout_id), json={"event_type": event_type, "data": {"value": 1.0}}, headers=AUTH
    )
    assert reply.status_code == 422, reply.text
    error = reply.json()["error"]
    assert error["code"] == "invalid_event"
    assert repr(event_type) in error["message"] and '"event_type": "reward"' in error["message"]
    [warning] = await client.list_events(rollout_id)  # the refusal is stored on the rollout, once per attempt
    assert warning.event_type == "proxy_refused_event"
    assert json.loads(warning.data_json) == {
        "status": 422,
        "code": "invalid_event",
        "message": error["message"],
        "event_type": event_type,
    }
    again = httpx.post(event_url(proxy, rollout_id), json={"event_type": event_type, "data": {}}, headers=AUTH)
    assert again.status_code == 422
    assert len(await client.list_events(rollout_id)) == 1

    fixed = httpx.post(
        event_url(proxy, rollout_id), json={"event_type": "reward", "data": {"value": 1.0}}, headers=AUTH
    )
    assert fixed.status_code == 200
    [_, event] = await client.list_events(rollout_id)
    assert event.event_type == "reward" and event.reward.value == 1.0


async def test_other_event_types_pass_through_untouched(proxy, client: LedgerClient) -> None:
    rollout_id = await new_rollout(client)
    for event_type in OTHER_TYPES:
        reply = httpx.post(
            event_url(proxy, rollout_id), json={"event_type": event_type, "data": {"x": 1}}, headers=AUTH
        )
        assert reply.status_code == 200, (event_type, reply.text)
    assert [e.event_type for e in await client.list_events(rollout_id)] == OTHER_TYPES


def test_refusals_are_counted_in_the_proxy_metrics(proxy) -> None:
    text = httpx.get(f"{proxy.url}/metrics").text
    line = next(line for line in text.splitlines() if line.startswith('agl_proxy_rejected_total{code="invalid_event"}'))
    assert float(line.split()[-1]) >= len(NEAR_MISSES)
