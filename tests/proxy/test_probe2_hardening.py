"""Issue 30's second probe against real proxy processes (ledger and stand-in engine on loopback): what an agent or a
master-key caller sends must give a clear 4xx or a bound, never a 500 or an unbounded /metrics."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.client import agent_token
from tests.support.procs import ServiceProcess

from .conftest import KEY, Http, event_url, new_rollout, run_proxy


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
