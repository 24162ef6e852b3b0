"""Issue 30 finding 6, at the ledger: per-rollout limits on the events stored, their bytes and one event's size
(real ledger processes on loopback with small limits, both stores; the exact accounting through the core).

The probe saw one agent's token take the memory-store ledger from 50 to 1,596 MiB, and one call store a 65.6 MB
event: nothing capped what one rollout stores.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from services._gen.agl.v1 import event_pb2
from services.client import LedgerClient
from services.ledger.errors import QuotaExceeded
from services.ledger.ledger import Ledger
from services.ledger.memory_store import MemoryStore
from services.ledger.quotas import EventQuotas
from services.ledger.sqlite_store import SqliteStore
from tests.support.procs import ServiceProcess, free_port, start_ledger

from .conftest import STORES, store_arg
from .support import RUNNING, custom, reward, spec

MAX_EVENTS = 6
PAD = 300_000  # three such events fit in 1 MiB, four do not
LIMITS = ["--max-rollout-events", str(MAX_EVENTS), "--max-rollout-mb", "1", "--max-event-mb", "1"]
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED


@pytest.fixture(scope="module", params=STORES)
def limited(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    """A ledger with small limits and its metrics endpoint (`metrics_url` set on it)."""
    directory = tmp_path_factory.mktemp(f"quotas-{request.param}")
    port = free_port()
    args = [*LIMITS, "--metrics-port", str(port)]
    with start_ledger(store=store_arg(request.param, directory), log_dir=directory, extra_args=args) as proc:
        proc.metrics_url = f"http://127.0.0.1:{port}/metrics"  # type: ignore[attr-defined]
        yield proc


@pytest.fixture
async def client(limited: ServiceProcess) -> AsyncIterator[LedgerClient]:
    async with LedgerClient(limited.address) as c:
        yield c


async def _running(client: LedgerClient, *ids: str) -> None:
    await client.create_rollouts([spec(rid) for rid in ids])
    for rid in ids:
        await client.update_status(rid, RUNNING, attempt_id="a1")


def _padded(rollout_id: str, size: int, tag: int = 0, event_id: str = "") -> event_pb2.Event:
    event = custom(rollout_id, json.dumps({"tag": tag, "pad": "x" * size}))
    event.event_id = event_id
    return event


async def _refused(call: object) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call  # type: ignore[misc]
    assert info.value.code() == EXHAUSTED, info.value.details()
    return info.value.details() or ""


async def test_a_rollout_at_its_event_limit_is_refused_and_keeps_what_it_holds(client: LedgerClient, uid: str):
    full, atomic, other = f"{uid}-full", f"{uid}-atomic", f"{uid}-other"
    await _running(client, full, atomic, other)
    first = reward(full, 0.0, event_id="first")
    await client.append_events([first])
    for k in range(1, MAX_EVENTS - 1):
        await client.append_events([reward(full, float(k))])
    await client.append_events([reward(full, float(MAX_EVENTS - 1))])
    details = await _refused(client.append_events([reward(full, 99.0)]))
    assert f"rollout {full} holds {MAX_EVENTS} events, its limit of {MAX_EVENTS} events per rollout" in details
    assert "--max-rollout-events" in details and "AGL_LEDGER_MAX_ROLLOUT_EVENTS" in details
    assert "nothing of this request was stored" in details
    # A retry of an event already stored stores nothing and is answered as before, at the limit too.
    assert list((await client.append_events([first])).sequences) == [1]
    values = [e.reward.value for e in await client.list_events(full)]
    assert values == [float(k) for k in range(MAX_EVENTS)]
    # Writers that belong after the end (the trainer's hooks and rows, master key only) are not limited: a full
    # rollout among the many in one of their requests must not fail it.
    await client.append_events([reward(other, 7.0), reward(full, 100.0)], allow_terminal=True)
    assert len(await client.list_events(full)) == MAX_EVENTS + 1

    # A request that would cross the limit stores none of its events; what fits alone is stored afterwards.
    for k in range(MAX_EVENTS - 1):
        await client.append_events([reward(atomic, float(k))])
    details = await _refused(client.append_events([reward(atomic, 10.0), reward(atomic, 11.0)]))
    assert details.startswith(f"events[1] (rollout {atomic})")
    assert len(await client.list_events(atomic)) == MAX_EVENTS - 1
    assert list((await client.append_events([reward(atomic, 10.0)])).sequences) == [MAX_EVENTS]
    assert list((await client.append_events([reward(other, 1.0)])).sequences) == [2]  # other rollouts go on


async def test_a_rollout_at_its_byte_limit_and_an_event_over_the_event_limit_are_refused(
    client: LedgerClient, uid: str
):
    rid, big = f"{uid}-bytes", f"{uid}-big"
    await _running(client, rid, big)
    for k in range(3):
        await client.append_events([_padded(rid, PAD, k)])
    details = await _refused(client.append_events([_padded(rid, PAD, 3)]))
    assert re.search(rf"rollout {rid} holds [\d,]+ bytes of events and this one \([\d,]+ bytes\)", details), details
    assert "its limit of 1 MiB per rollout" in details and "--max-rollout-mb" in details
    assert "AGL_LEDGER_MAX_ROLLOUT_MB" in details
    await client.append_events([_padded(rid, 1_000, 4)])  # what still fits is stored: a limit of bytes, not events
    assert [json.loads(e.data_json)["tag"] for e in await client.list_events(rid)] == [0, 1, 2, 4]

    details = await _refused(client.append_events([_padded(big, 1_200_000)]))
    assert re.search(r"the event is [\d,]+ bytes, over the limit of 1 MiB for one event", details), details
    assert "--max-event-mb" in details and "AGL_LEDGER_MAX_EVENT_MB" in details
    assert await client.list_events(big) == []


async def test_a_refusal_in_a_merged_request_reaches_only_its_sender(client: LedgerClient, uid: str):
    """Finding 1 kept fixed for the new refusal: calls merged into one AppendEvents request with a rollout at its
    limit are stored, and only the full rollout's caller hears RESOURCE_EXHAUSTED."""
    good = [f"{uid}-good-{i}" for i in range(8)]
    full = f"{uid}-full"
    await _running(client, full, *good)
    for k in range(MAX_EVENTS):
        await client.append_events([reward(full, float(k))])
    before = client.append_requests

    async def well_behaved(rid: str) -> list[int]:
        first = await client.append_events([reward(rid, 0.0), reward(rid, 1.0)])
        second = await client.append_events([reward(rid, 2.0)])
        return [*first.sequences, *second.sequences]

    over = [client.append_events([reward(full, 50.0 + k)]) for k in range(3)]
    results = await asyncio.gather(
        *(well_behaved(rid) for rid in good[:4]), *over, *(well_behaved(rid) for rid in good[4:]),
        return_exceptions=True,
    )  # fmt: skip
    assert client.append_requests - before < len(results) * 2  # the calls were merged
    for error in results[4:7]:
        assert isinstance(error, grpc.aio.AioRpcError) and error.code() == EXHAUSTED, error
        assert full in (error.details() or "")
    assert results[:4] + results[7:] == [[1, 2, 3]] * 8
    for rid in good:
        assert [e.reward.value for e in await client.list_events(rid)] == [0.0, 1.0, 2.0]
    assert [e.reward.value for e in await client.list_events(full)] == [float(k) for k in range(MAX_EVENTS)]


async def test_refusals_are_counted_by_limit_in_the_metrics(client: LedgerClient, limited: ServiceProcess, uid: str):
    rid = f"{uid}-counted"
    await _running(client, rid)

    def refused() -> dict[str, float]:
        text = httpx.get(limited.metrics_url).text  # type: ignore[attr-defined]
        found = re.findall(r'^agl_ledger_appends_refused_total\{limit="(\w+)"\} ([\d.e+]+)$', text, re.M)
        return {limit: float(value) for limit, value in found}

    before = refused()
    assert set(before) == {"rollout_events", "rollout_bytes", "event_bytes"}
    await _refused(client.append_events([_padded(rid, 1_200_000)]))
    after = refused()
    assert after["event_bytes"] == before["event_bytes"] + 1
    assert after["rollout_events"] == before["rollout_events"]


async def test_a_restarted_sqlite_ledger_keeps_counting_what_each_rollout_holds(tmp_path: Path) -> None:
    store = store_arg("sqlite", tmp_path)
    args = ["--max-rollout-events", "4", "--max-rollout-mb", "1"]
    with start_ledger(store=store, log_dir=tmp_path, extra_args=args) as ledger:
        async with LedgerClient(ledger.address) as client:
            await _running(client, "counted", "sized")
            await client.append_events([reward("counted", float(k)) for k in range(4)])
            for k in range(3):
                await client.append_events([_padded("sized", PAD, k)])
            stored = {rid: await client.list_events(rid) for rid in ("counted", "sized")}
    with start_ledger(store=store, log_dir=tmp_path, extra_args=args) as ledger:
        async with LedgerClient(ledger.address) as client:
            assert "holds 4 events" in await _refused(client.append_events([reward("counted", 9.0)]))
            assert "bytes of events" in await _refused(client.append_events([_padded("sized", PAD, 3)]))
            assert {rid: await client.list_events(rid) for rid in ("counted", "sized")} == stored
            await client.append_events([_padded("sized", 1_000, 4)])


@pytest.mark.parametrize("kind", STORES)
async def test_a_rollout_s_bytes_are_its_events_as_stored_and_a_reload_recounts_them(tmp_path: Path, kind: str):
    """The core: the count is the stored events' bytes exactly; a refusal changes nothing; SQLite's reload recounts
    the same number."""

    def open_ledger(limit: int) -> Ledger:
        store = MemoryStore() if kind == "memory" else SqliteStore(tmp_path / "l.db")
        ledger = Ledger(store, quotas=EventQuotas(max_rollout_bytes=limit))
        ledger.load()
        return ledger

    ledger = open_ledger(20_000)
    await ledger.create_rollouts([spec("r")])
    await ledger.update_status("r", RUNNING, attempt_id="a1")
    await ledger.append_events([_padded("r", 5_000, 0), _padded("r", 7_000, 1)])
    entry = ledger.rollouts["r"]
    held = entry.event_bytes
    assert held == sum(len(data) for _, data in ledger.store.read_events("r", None, None, 0, 10))
    with pytest.raises(QuotaExceeded, match="would take it past its limit of 20,000 bytes per rollout") as info:
        ledger.stage_events([_padded("r", 1_000, 2, "e2"), _padded("r", 7_000, 3, "e3")])
    assert info.value.limit == "rollout_bytes" and ledger.quota_refusals == {"rollout_bytes": 1}
    assert (entry.next_seq, entry.event_bytes) == (3, held)  # the request's first event was not taken either
    assert (await ledger.append_events([_padded("r", 1_000, 2, "e2")]))[0] == [3]  # nor its id
    assert len(ledger.store.read_events("r", None, None, 0, 10)) == 3
    held = entry.event_bytes
    await ledger.close()
    if kind == "memory":
        return  # nothing to reload: a volatile store starts empty
    reloaded = open_ledger(20_000)
    assert (reloaded.rollouts["r"].next_seq, reloaded.rollouts["r"].event_bytes) == (4, held)
    with pytest.raises(QuotaExceeded):
        reloaded.stage_events([_padded("r", 7_000, 3)])
    assert (await reloaded.append_events([_padded("r", 1_000, 4)]))[0] == [4]
    await reloaded.close()
