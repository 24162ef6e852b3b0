"""The client's boundary: every failed call raises the typed error its status maps to, and an informer keeps a
cache equal to what a watch selects (real ledger on loopback, both stores)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from services.client import ROLLOUTS, Handler, Informer, LedgerClient, RetryPolicy
from services.client import errors as ledger
from services.proxy.errors import from_ledger, v1_status
from tests.support.procs import ServiceProcess, start_ledger

from .support import QUEUING, RUNNING, SUCCEEDED, spec


@pytest.fixture
async def client(ledger_proc: ServiceProcess):
    async with LedgerClient(ledger_proc.address) as c:
        yield c


async def test_each_status_raises_its_own_error_class(client: LedgerClient, uid: str) -> None:
    with pytest.raises(ledger.NotFound) as missing:
        await client.get_rollout(f"{uid}-missing")
    assert missing.value.code_name == "NOT_FOUND" and f"{uid}-missing" in missing.value.message

    rollout_id = f"{uid}-cas"
    (created,) = await client.create_rollouts([spec(rollout_id)])
    await client.update_status(rollout_id, RUNNING, attempt_id="a1", expected_version=created.status.version)
    with pytest.raises(ledger.Conflict) as lost:  # the same compare-and-set again: the version has moved on
        await client.update_status(rollout_id, RUNNING, attempt_id="a2", expected_version=created.status.version)
    assert lost.value.code_name == "ABORTED"
    await client.update_status(rollout_id, SUCCEEDED)
    with pytest.raises(ledger.FailedPrecondition) as ended:
        await client.update_status(rollout_id, RUNNING, attempt_id="a3")
    assert "succeeded" in ended.value.message

    # One meaning per status in the proxy: ABORTED is 409 on the agents' routes and on v1.0's REST routes alike.
    assert from_ledger(lost.value, "UpdateRolloutStatus").status == 409 == v1_status(lost.value)
    assert from_ledger(missing.value, "GetRollout").status == 404 == v1_status(missing.value)


async def test_a_refused_key_is_refused_not_retried() -> None:
    with start_ledger(key="right-key") as keyed:
        async with LedgerClient(keyed.address, "wrong-key", retry=RetryPolicy(attempts=3)) as client:
            with pytest.raises(ledger.Refused) as refused:
                await client.get_proxy_control()
    assert isinstance(refused.value, ledger.LedgerError) and refused.value.code_name == "UNAUTHENTICATED"


class _Heard(Handler[object]):
    def __init__(self) -> None:
        self.news: list[tuple[str, str]] = []

    def on_upsert(self, old: object, new: object) -> None:
        self.news.append(("upsert", new.rollout_id))  # type: ignore[attr-defined]

    def on_delete(self, old: object, gone: object) -> None:
        self.news.append(("delete", gone.rollout_id))  # type: ignore[attr-defined]


async def _until(condition, what: str) -> None:
    for _ in range(200):
        if condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(what)


async def test_an_informer_caches_what_its_watch_selects(client: LedgerClient, uid: str) -> None:
    labels = {"informer": uid}
    ids = [f"{uid}-{k}" for k in range(3)]
    await client.create_rollouts([spec(i, labels) for i in ids[:2]])
    heard = _Heard()

    def watch():
        return client.watch_rollouts(states=[QUEUING], labels=labels)

    informer = Informer(watch, ROLLOUTS, heard, keep=lambda r: r.status.state == QUEUING)
    task = asyncio.create_task(informer.run())
    try:
        await asyncio.wait_for(informer.synced.wait(), 10)
        assert set(informer.items) == set(ids[:2])  # the snapshot

        await client.create_rollouts([spec(ids[2], labels)])
        await _until(lambda: ids[2] in informer.items, "a created rollout never reached the cache")
        await client.update_status(ids[0], RUNNING, attempt_id="a1")  # leaves the watch's filter
        await client.delete_rollouts([ids[1]])
        await _until(lambda: set(informer.items) == {ids[2]}, f"cache is {set(informer.items)}")
        assert ("upsert", ids[0]) in heard.news and ("delete", ids[1]) in heard.news
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
