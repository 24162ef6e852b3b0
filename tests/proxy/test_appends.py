"""The proxy's appends (LedgerGateway.append over LedgerClient.append_events) against the real ledger: concurrent
appends share requests, each caller still gets its own sequence or its own error, and a ledger that does not
answer in time, goes away or restarts gives 503, never a hang and never a duplicate."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from services._gen.agl.v1 import event_pb2, rollout_pb2
from services.client import LedgerClient, RetryPolicy
from services.proxy.errors import ProxyError
from services.proxy.fleet.ledger_gateway import LedgerGateway
from tests.support.procs import free_port, start_ledger

from .conftest import KEY, new_rollout


def note(rollout_id: str, n: int, event_id: str = "") -> event_pb2.Event:
    data = json.dumps({"n": n})
    return event_pb2.Event(
        rollout_id=rollout_id, attempt_id="at-1", event_type="note", data_json=data, event_id=event_id
    )


async def test_concurrent_appends_share_requests_and_refusals_stay_with_their_caller(client: LedgerClient) -> None:
    live, finished = await new_rollout(client), await new_rollout(client)
    await client.update_status(finished, rollout_pb2.ROLLOUT_STATE_SUCCEEDED)
    async with LedgerClient(client.address, KEY) as own:
        gateway = LedgerGateway(own, cache_ttl_s=5.0, append_timeout_s=30.0)
        grouped = await asyncio.gather(*(gateway.append(note(live, -1 - n)) for n in range(20)))
        assert gateway.append_requests < 20  # merged: fewer AppendEvents requests than appends
        assert len(set(grouped)) == 20
        targets = ["ro-missing" if n % 11 == 5 else finished if n % 7 == 3 else live for n in range(40)]
        results = await asyncio.gather(
            *(gateway.append(note(r, n)) for n, r in enumerate(targets)), return_exceptions=True
        )
    stored = {json.loads(e.data_json)["n"]: e.sequence for e in await client.list_events(live)}
    assert sorted(grouped) == sorted(s for n, s in stored.items() if n < 0)
    for n, (target, result) in enumerate(zip(targets, results, strict=True)):
        if target == finished:
            assert isinstance(result, ProxyError) and result.kind == "rollout_terminal" and result.status == 409
        elif target == "ro-missing":
            assert isinstance(result, ProxyError) and result.kind == "rollout_not_found" and result.status == 404
        else:
            assert result == stored[n]
    assert sorted(n for n in stored if n >= 0) == [n for n, r in enumerate(targets) if r == live]
    assert await client.list_events(finished) == []


async def test_a_ledger_that_does_not_answer_in_time_is_503() -> None:
    # Nothing listens: every try is UNAVAILABLE, and the client would retry far longer than the proxy's deadline.
    client = LedgerClient(f"127.0.0.1:{free_port()}", retry=RetryPolicy(attempts=10_000, max_backoff_s=0.05))
    gateway = LedgerGateway(client, cache_ttl_s=5.0, append_timeout_s=0.3)
    try:
        results = await asyncio.gather(*(gateway.append(note("ro-x", n)) for n in range(5)), return_exceptions=True)
    finally:
        await client.close()
    for result in results:
        assert isinstance(result, ProxyError) and result.kind == "ledger_unavailable" and result.status == 503
        assert "did not acknowledge within 0.3s" in result.message


async def test_a_ledger_gone_for_longer_than_the_retries_is_503() -> None:
    client = LedgerClient(f"127.0.0.1:{free_port()}", retry=RetryPolicy(attempts=3, initial_backoff_s=0.01))
    gateway = LedgerGateway(client, cache_ttl_s=5.0, append_timeout_s=30.0)
    try:
        results = await asyncio.gather(*(gateway.append(note("ro-x", n)) for n in range(5)), return_exceptions=True)
    finally:
        await client.close()
    for result in results:
        assert isinstance(result, ProxyError) and result.kind == "ledger_unavailable"
        assert "UNAVAILABLE" in result.message


async def test_closing_the_client_under_an_append_is_503_not_a_hang() -> None:
    client = LedgerClient(f"127.0.0.1:{free_port()}", retry=RetryPolicy(attempts=10_000, max_backoff_s=0.05))
    gateway = LedgerGateway(client, cache_ttl_s=5.0, append_timeout_s=30.0)
    append = asyncio.create_task(gateway.append(note("ro-x", 1)))
    while client.append_requests == 0:  # sent (and being retried)
        await asyncio.sleep(0.01)
    await client.close()
    error = (await asyncio.gather(append, return_exceptions=True))[0]
    assert isinstance(error, ProxyError) and error.kind == "ledger_unavailable"


async def test_appends_across_a_ledger_restart_are_stored_once_or_answered_503(tmp_path: Path) -> None:
    """kill -9 the (SQLite) ledger under concurrent proxy appends and start it again on the same port: every append
    either returns the sequence it is stored under, or 503; no event is stored twice."""
    port = free_port()
    store = f"sqlite:{tmp_path / 'ledger.db'}"
    with start_ledger(store=store, port=port, key=KEY, log_dir=tmp_path) as first:
        client = LedgerClient(first.address, KEY, retry=RetryPolicy(attempts=200, max_backoff_s=0.1))
        gateway = LedgerGateway(client, cache_ttl_s=5.0, append_timeout_s=20.0)
        ids = [await new_rollout(client) for _ in range(8)]
        progress = asyncio.Event()

        async def appender(rollout_id: str) -> dict[str, int | ProxyError]:
            outcome: dict[str, int | ProxyError] = {}
            for k in range(20):
                event_id = f"{rollout_id}-{k}"
                try:
                    outcome[event_id] = await gateway.append(note(rollout_id, k, event_id))
                except ProxyError as err:
                    outcome[event_id] = err
                if k == 4:
                    progress.set()
            return outcome

        work = asyncio.gather(*(appender(rid) for rid in ids))
        await progress.wait()
        first.kill()
    with start_ledger(store=store, port=port, key=KEY, log_dir=tmp_path):
        outcomes = await asyncio.wait_for(work, 60)
        for rollout_id, outcome in zip(ids, outcomes, strict=True):
            events = await client.list_events(rollout_id)
            stored = {e.event_id: e.sequence for e in events}
            assert len(stored) == len(events)  # no event id twice
            for event_id, result in outcome.items():
                if isinstance(result, ProxyError):
                    assert result.kind == "ledger_unavailable"
                else:
                    assert stored[event_id] == result
        assert sum(isinstance(r, int) for outcome in outcomes for r in outcome.values()) > 8 * 5
        await client.close()
