"""Ledger unreachable: the agent gets 503 (or an error event in a stream) and no half-written call survives."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import openai
import pytest

from services._gen.agl.v1 import event_pb2
from services.client import LedgerClient
from tests.support.procs import start_ledger

from .conftest import AUTH, KEY, MODEL, base_url, model_endpoints, new_rollout, run_proxy, run_standin

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "What is 5 + 5?"}]}


def wait_until(predicate, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.05)


async def test_ledger_down_gives_503_and_nothing_half_written(tmp_path: Path) -> None:
    store = f"sqlite:{tmp_path / 'ledger.db'}"
    with start_ledger(store=store, key=KEY) as ledger, run_standin() as engine:
        async with LedgerClient(ledger.address, KEY) as client:
            await client.register_models(model_endpoints(engine))
            rollout_id = await new_rollout(client)
        with run_proxy(ledger.address, args=["--rollout-cache-ttl", "600"]) as proxy:
            url = f"{base_url(proxy, rollout_id)}/chat/completions"
            assert httpx.post(url, json=CHAT, headers=AUTH).status_code == 200

            ledger.kill()
            down = httpx.post(url, json=CHAT, headers=AUTH, timeout=60)
            assert down.status_code == 503 and down.json()["error"]["code"] == "ledger_unavailable"
            sdk = openai.OpenAI(base_url=base_url(proxy, rollout_id), api_key=KEY, max_retries=0, timeout=60)
            with pytest.raises(openai.APIError):  # a 503, or chunks that end in an error, never [DONE]
                for _ in sdk.chat.completions.create(**CHAT, stream=True):
                    pass
            sdk.close()
            reward = {"event_type": "reward", "data": {"value": 1}}
            events_url = f"{proxy.url}/api/rollouts/{rollout_id}/attempt/at-1/events"
            assert httpx.post(events_url, json=reward, headers=AUTH, timeout=60).status_code == 503

            with start_ledger(store=store, key=KEY, port=ledger.port):
                async with LedgerClient(ledger.address, KEY) as client:
                    events = await client.list_events(rollout_id)
                    assert [e.model_request.status for e in events] == [event_pb2.MODEL_REQUEST_STATUS_OK]
                    wait_until(lambda: httpx.post(url, json=CHAT, headers=AUTH).status_code == 200)
                    assert len(await client.list_events(rollout_id)) == 2


async def test_a_call_after_a_ledger_restart_is_routed_on_the_registry_as_it_is_now(tmp_path: Path) -> None:
    # The trainer's sync step: the ledger dies during a weight push, comes back, the push registers the engine at
    # the new version and rollouts start at once. The proxy's registry stream is still waiting to reconnect then;
    # a call routed on the view from before the outage would be recorded as sampled by the old weights.
    store = f"sqlite:{tmp_path / 'ledger.db'}"
    with start_ledger(store=store, key=KEY) as ledger, run_standin() as engine:
        async with LedgerClient(ledger.address, KEY) as client:
            await client.register_models(model_endpoints(engine, version=1))
            rollout_id = await new_rollout(client)
        with run_proxy(ledger.address, args=["--rollout-cache-ttl", "600"]) as proxy:
            url = f"{base_url(proxy, rollout_id)}/chat/completions"
            assert httpx.post(url, json=CHAT, headers=AUTH).status_code == 200
            ledger.kill()
            time.sleep(2.5)  # the proxy's streams fail over and over meanwhile: their reconnects back off
            with start_ledger(store=store, key=KEY, port=ledger.port):
                async with LedgerClient(ledger.address, KEY) as client:
                    await client.register_models(model_endpoints(engine, version=2))
                    answer = httpx.post(url, json=CHAT, headers=AUTH, timeout=60)
                    assert answer.status_code == 200, answer.text
                    events = await client.list_events(rollout_id)
                    versions = [e.model_request.model_version for e in events if e.HasField("model_request")]
                    assert versions == [1, 2], versions
