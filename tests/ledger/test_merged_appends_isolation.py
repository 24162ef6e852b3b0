"""Issue 30 finding 1, at the client: concurrent appends of many callers share AppendEvents requests, and nothing
one caller sends may fail another caller's write (real ledger, both stores).

The probe saw one agent re-post an event id it had used with other data: the merged request was refused with
ALREADY_EXISTS as a whole, and every other caller in it got the 409 and lost its events.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from services._gen.agl.v1 import event_pb2
from services.client import LedgerClient
from tests.support.procs import ServiceProcess

from .support import RUNNING, SUCCEEDED, custom, reward, spec


@pytest.fixture
async def client(ledger_proc: ServiceProcess):
    async with LedgerClient(ledger_proc.address) as c:
        yield c


async def _running(client: LedgerClient, *ids: str) -> None:
    await client.create_rollouts([spec(rid) for rid in ids])
    for rid in ids:
        await client.update_status(rid, RUNNING, attempt_id="a1")


def _note(rollout_id: str, data_json: str, event_id: str) -> event_pb2.Event:
    event = custom(rollout_id, data_json)
    event.event_id = event_id
    return event


async def _values(client: LedgerClient, rid: str) -> list[float]:
    return [e.reward.value for e in await client.list_events(rid)]


async def test_an_event_id_reused_with_other_content_is_refused_to_its_sender_alone(client: LedgerClient, uid: str):
    good = [f"{uid}-good-{i}" for i in range(8)]
    bad = f"{uid}-bad"
    await _running(client, bad, *good)
    await client.append_events([_note(bad, '{"n": 0}', "reused")])
    before = client.append_requests

    async def well_behaved(rid: str) -> list[int]:
        first = await client.append_events([reward(rid, 0.0), reward(rid, 1.0)])
        second = await client.append_events([reward(rid, 2.0)])
        return [*first.sequences, *second.sequences]

    # Queued together before the sender runs, so the conflicting calls share requests with the good ones.
    conflicting = [client.append_events([_note(bad, f'{{"n": {k}}}', "reused")]) for k in range(1, 4)]
    results = await asyncio.gather(
        *(well_behaved(rid) for rid in good[:4]), *conflicting, *(well_behaved(rid) for rid in good[4:]),
        return_exceptions=True,
    )  # fmt: skip
    assert client.append_requests - before < len(results) * 2  # the calls were merged
    refused = results[4:7]
    for error in refused:
        assert isinstance(error, grpc.aio.AioRpcError) and error.code() == grpc.StatusCode.ALREADY_EXISTS, error
        assert bad in (error.details() or "") and "reused" in (error.details() or "")
    assert results[:4] + results[7:] == [[1, 2, 3]] * 8
    for rid in good:
        assert await _values(client, rid) == [0.0, 1.0, 2.0]
    assert [e.data_json for e in await client.list_events(bad)] == ['{"n": 0}']


async def test_one_event_id_posted_twice_at_once_with_other_content_is_refused_to_the_second(
    client: LedgerClient, uid: str
):
    """Two calls with one event id and different content, merged into one request: the first is stored and the
    second is refused, as when they go one after the other (a merge used to answer both with the first's sequence)."""
    rid, other = f"{uid}-r", f"{uid}-other"
    await _running(client, rid, other)
    first, second, bystander = await asyncio.gather(
        client.append_events([_note(rid, '{"a": 1}', "same")]),
        client.append_events([_note(rid, '{"a": 2}', "same")]),
        client.append_events([reward(other, 1.0)]),
        return_exceptions=True,
    )
    assert list(first.sequences) == [1]
    assert isinstance(second, grpc.aio.AioRpcError) and second.code() == grpc.StatusCode.ALREADY_EXISTS, second
    assert "same" in (second.details() or "")
    assert list(bystander.sequences) == [1]
    assert [e.data_json for e in await client.list_events(rid)] == ['{"a": 1}']
    # The same event given twice in one call with other content is refused, the call's other events with it
    # (one call is atomic); repeated unchanged it is stored once.
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await client.append_events([_note(rid, '{"b": 1}', "twice"), _note(rid, '{"b": 2}', "twice")])
    assert info.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert "events[1]" in (info.value.details() or "") and "events[0]" in (info.value.details() or "")
    reply = await client.append_events([_note(rid, '{"c": 1}', "again"), _note(rid, '{"c": 1}', "again")])
    assert list(reply.sequences) == [2, 2]
    assert [e.data_json for e in await client.list_events(rid)] == ['{"a": 1}', '{"c": 1}']


KINDS = ("bad_json", "no_rollout", "finished", "no_attempt", "long_id", "reused_id")


@pytest.mark.parametrize("first", KINDS)
async def test_every_kind_of_refusal_in_a_merge_reaches_only_its_sender(client: LedgerClient, uid: str, first: str):
    """Each per-event refusal the ledger makes, all in one merge with well-behaved callers; `first` is the one queued
    first, whose status the merged request is refused with (the ledger stops at the first bad event)."""
    good = [f"{uid}-good-{i}" for i in range(6)]
    done, reused = f"{uid}-done", f"{uid}-reused"
    await _running(client, done, reused, *good)
    await client.update_status(done, SUCCEEDED)
    await client.append_events([_note(reused, "{}", "id")])
    bad = {
        "bad_json": (grpc.StatusCode.INVALID_ARGUMENT, custom(good[0], "{not json")),
        "no_rollout": (grpc.StatusCode.NOT_FOUND, reward(f"{uid}-missing", 1.0)),
        "finished": (grpc.StatusCode.FAILED_PRECONDITION, reward(done, 1.0)),
        "no_attempt": (grpc.StatusCode.NOT_FOUND, reward(good[1], 1.0, attempt_id="never")),
        "long_id": (grpc.StatusCode.INVALID_ARGUMENT, _note(good[2], "{}", "x" * 300)),
        "reused_id": (grpc.StatusCode.ALREADY_EXISTS, _note(reused, "[]", "id")),
    }
    order = [first, *(kind for kind in KINDS if kind != first)]
    calls = [client.append_events([bad[kind][1]]) for kind in order]
    calls += [client.append_events([reward(rid, 5.0)]) for rid in good]
    results = await asyncio.gather(*calls, return_exceptions=True)
    for kind, error in zip(order, results[: len(order)], strict=True):
        assert isinstance(error, grpc.aio.AioRpcError) and error.code() == bad[kind][0], (kind, error)
    assert [list(r.sequences) for r in results[len(order) :]] == [[1]] * 6
    for rid in good:
        assert await _values(client, rid) == [5.0]
