"""LedgerClient.append_events merges concurrent calls into shared AppendEvents requests (real ledger, both stores).

Each caller must get exactly its own answer (sequences, attempt ids) or its own error, every event must be
stored once and in each caller's order, whatever else shared the request.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import grpc
import pytest

from services._gen.agl.v1 import event_pb2
from services.client import LedgerClient, RetryPolicy
from tests.support.procs import ServiceProcess, free_port, start_ledger

from .support import RUNNING, SUCCEEDED, custom, model_request, reward, spec


@pytest.fixture
async def client(ledger_proc: ServiceProcess):
    async with LedgerClient(ledger_proc.address) as c:
        yield c


async def _running(client: LedgerClient, *ids: str) -> None:
    await client.create_rollouts([spec(rid) for rid in ids])
    for rid in ids:
        await client.update_status(rid, RUNNING, attempt_id="a1")


async def _appender(client: LedgerClient, rid: str, count: int) -> list[int]:
    """One caller appending single events one after another; returns the sequences it was given."""
    sequences = []
    for k in range(count):
        reply = await client.append_events([reward(rid, float(k))])
        assert list(reply.attempt_ids) == ["a1"]
        sequences += reply.sequences
    return sequences


async def _rewards(client: LedgerClient, rid: str) -> list[float]:
    events = await client.list_events(rid)
    assert [e.sequence for e in events] == list(range(1, len(events) + 1))
    return [e.reward.value for e in events]


async def test_concurrent_single_appends_share_requests_and_get_their_own_answers(client: LedgerClient, uid: str):
    ids = [f"{uid}-{i}" for i in range(32)]
    await _running(client, *ids)
    before = client.append_requests
    results = await asyncio.gather(*(_appender(client, rid, 6) for rid in ids))
    assert results == [[1, 2, 3, 4, 5, 6]] * 32
    # All 32 first calls queue before the sender runs, so they go out as one request at least.
    assert client.append_requests - before < 32 * 6
    for rid in ids:
        assert await _rewards(client, rid) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]  # each stored once, in order


async def test_multi_event_calls_are_sliced_back_per_caller(client: LedgerClient, uid: str):
    await _running(client, f"{uid}-a", f"{uid}-b")
    a = [model_request(f"{uid}-a", [1, 2], [3], [-0.5]), reward(f"{uid}-a", 1.0)]
    b = [custom(f"{uid}-b", "{}"), custom(f"{uid}-b", "[1]"), reward(f"{uid}-b", 0.0)]
    c = [custom(f"{uid}-a", '{"late": true}', attempt_id="a1")]
    ra, rb, rc = await asyncio.gather(client.append_events(a), client.append_events(b), client.append_events(c))
    assert (list(ra.sequences), list(rb.sequences), list(rc.sequences)) == ([1, 2], [1, 2, 3], [3])
    assert (list(ra.attempt_ids), list(rc.attempt_ids)) == (["a1", "a1"], ["a1"])
    assert [e.event_type for e in await client.list_events(f"{uid}-b")] == ["note", "note", "reward"]


async def _bad_call(client: LedgerClient, uid: str, kind: str) -> tuple[grpc.StatusCode, str, object]:
    """A call that the ledger refuses, of the given kind: (expected code, text in the details, the call)."""
    if kind == "not_found":
        rid = f"{uid}-missing"
        return grpc.StatusCode.NOT_FOUND, rid, client.append_events([reward(rid, 1.0)])
    if kind == "invalid":
        rid = f"{uid}-bad"
        await _running(client, rid)
        return grpc.StatusCode.INVALID_ARGUMENT, "data_json", client.append_events([custom(rid, "{not json")])
    rid = f"{uid}-done"
    await _running(client, rid)
    await client.update_status(rid, SUCCEEDED)
    call = client.append_events([reward(rid, 1.0)])
    return grpc.StatusCode.FAILED_PRECONDITION, rid, call


@pytest.mark.parametrize("kind", ["not_found", "invalid", "terminal"])
async def test_a_refused_call_fails_alone_and_the_others_are_stored_once(client: LedgerClient, uid: str, kind: str):
    ids = [f"{uid}-{i}" for i in range(12)]
    await _running(client, *ids)
    code, detail, bad = await _bad_call(client, uid, kind)

    async def good(rid: str) -> list[int]:  # in the same lane as the bad call
        first = await client.append_events([reward(rid, 0.0), reward(rid, 1.0)])
        second = await client.append_events([reward(rid, 2.0)])
        return [*first.sequences, *second.sequences]

    calls = [good(rid) for rid in ids[:6]] + [bad] + [good(rid) for rid in ids[6:]]
    results = await asyncio.gather(*calls, return_exceptions=True)
    error = results.pop(6)
    assert isinstance(error, grpc.aio.AioRpcError) and error.code() == code, error
    assert detail in (error.details() or "")
    assert results == [[1, 2, 3]] * 12
    for rid in ids:
        assert await _rewards(client, rid) == [0.0, 1.0, 2.0]


async def test_every_caller_of_a_refused_merge_gets_its_own_error(client: LedgerClient, uid: str):
    calls = [client.append_events([reward(f"{uid}-none-{i}", 1.0)]) for i in range(5)]
    errors = await asyncio.gather(*calls, return_exceptions=True)
    for i, error in enumerate(errors):
        assert isinstance(error, grpc.aio.AioRpcError) and error.code() == grpc.StatusCode.NOT_FOUND
        assert f"{uid}-none-{i}" in (error.details() or "")


async def test_lanes_keep_allow_terminal_per_call(client: LedgerClient, uid: str):
    rid = f"{uid}-r"
    await _running(client, rid)
    await client.update_status(rid, SUCCEEDED)
    late, refused = await asyncio.gather(
        client.append_events([custom(rid, '{"log": 1}')], allow_terminal=True),
        client.append_events([reward(rid, 1.0)]),
        return_exceptions=True,
    )
    assert list(late.sequences) == [1]
    assert isinstance(refused, grpc.aio.AioRpcError) and refused.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert [e.event_type for e in await client.list_events(rid)] == ["note"]


async def test_a_repeated_event_id_in_one_merge_is_stored_once(client: LedgerClient, uid: str):
    rid = f"{uid}-r"
    await _running(client, rid)
    replies = await asyncio.gather(*(client.append_events([reward(rid, 1.0, event_id="same")]) for _ in range(4)))
    assert [list(r.sequences) for r in replies] == [[1]] * 4
    assert await _rewards(client, rid) == [1.0]


async def test_events_without_an_id_get_one_and_the_callers_events_are_left_alone(client: LedgerClient, uid: str):
    rid = f"{uid}-r"
    await _running(client, rid)
    mine = [reward(rid, 1.0), reward(rid, 2.0, event_id="chosen"), custom(rid, '{"k": "v"}')]
    before = [e.SerializeToString() for e in mine]
    reply = await client.append_events(mine)
    assert list(reply.sequences) == [1, 2, 3] and list(reply.attempt_ids) == ["a1"] * 3
    assert [e.SerializeToString() for e in mine] == before  # not filled in on the caller's objects
    stored = await client.list_events(rid)
    assert [e.event_type for e in stored] == ["reward", "reward", "note"]
    assert [e.reward.value for e in stored[:2]] == [1.0, 2.0] and stored[2].data_json == '{"k": "v"}'
    assert stored[1].event_id == "chosen"
    filled = [stored[0].event_id, stored[2].event_id]
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in filled) and filled[0] != filled[1]


async def test_a_caller_cancelled_before_sending_sends_nothing(client: LedgerClient, uid: str):
    rid = f"{uid}-r"
    await _running(client, rid)
    before = client.append_requests
    task = asyncio.create_task(client.append_events([reward(rid, 1.0)]))
    await asyncio.sleep(0)  # queued; the sender has not run yet
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    reply = await client.append_events([reward(rid, 2.0)])
    assert list(reply.sequences) == [1] and await _rewards(client, rid) == [2.0]
    assert client.append_requests - before == 1


async def test_a_caller_timing_out_in_flight_leaves_the_others_answered(client: LedgerClient, uid: str):
    """What the proxy's deadline does: a caller gives up while its merged request is in flight; the request still
    completes for everybody else, and the client keeps working."""
    ids = [f"{uid}-{i}" for i in range(8)]
    await _running(client, *ids)
    before = client.append_requests
    tasks = [asyncio.create_task(client.append_events([reward(rid, 1.0)])) for rid in ids]
    while client.append_requests == before:  # the merged request is on its way
        await asyncio.sleep(0)
    tasks[3].cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(results.pop(3), asyncio.CancelledError)
    assert [list(r.sequences) for r in results] == [[1]] * 7
    reply = await client.append_events([reward(ids[0], 2.0)])
    assert list(reply.sequences) == [2] and await _rewards(client, ids[0]) == [1.0, 2.0]


async def test_merged_requests_stay_under_the_size_cap(ledger_proc: ServiceProcess, uid: str):
    async with LedgerClient(ledger_proc.address, max_message_bytes=64 * 1024) as client:  # cap: 32 KiB per request
        ids = [f"{uid}-{i}" for i in range(20)]
        await _running(client, *ids)
        before = client.append_requests
        big = [model_request(rid, list(range(1000)), [1, 2], [-0.1, -0.2]) for rid in ids]  # ~2 KiB each
        replies = await asyncio.gather(*(client.append_events([event]) for event in big))
        assert [list(r.sequences) for r in replies] == [[1]] * 20
        assert client.append_requests - before >= 2
        for rid in ids:
            [event] = await client.list_events(rid)
            assert list(event.model_request.prompt_token_ids) == list(range(1000))


async def test_appends_survive_a_ledger_restart_without_duplicates(tmp_path: Path, uid: str):
    """kill -9 the (SQLite) ledger under concurrent coalesced appends and start it again on the same port: the
    calls retry UNAVAILABLE, and a merged request that was stored before the kill is not stored twice."""
    port = free_port()
    store = f"sqlite:{tmp_path / 'ledger.db'}"
    retry = RetryPolicy(attempts=200, initial_backoff_s=0.02, max_backoff_s=0.1)
    ids = [f"{uid}-{i}" for i in range(16)]
    with start_ledger(store=store, port=port, log_dir=tmp_path) as first:
        client = LedgerClient(first.address, retry=retry)
        await _running(client, *ids)
        progress = asyncio.Event()

        async def appender(rid: str) -> list[int]:
            sequences = []
            for k in range(30):
                reply = await client.append_events([reward(rid, float(k), event_id=f"{rid}-{k}")])
                sequences += reply.sequences
                if k == 5:
                    progress.set()
            return sequences

        work = asyncio.gather(*(appender(rid) for rid in ids))
        await progress.wait()
        first.kill()
    with start_ledger(store=store, port=port, log_dir=tmp_path):
        results = await asyncio.wait_for(work, 60)
        assert results == [list(range(1, 31))] * 16
        for rid in ids:
            events = await client.list_events(rid)
            assert [e.reward.value for e in events] == [float(k) for k in range(30)]
            assert [e.event_id for e in events] == [f"{rid}-{k}" for k in range(30)]
        await client.close()


async def test_appends_ride_one_stream_that_is_reopened_after_a_restart(tmp_path: Path, uid: str):
    """Appends go over one StreamAppendEvents call; when the ledger restarts, the next append opens a new one."""
    port = free_port()
    store = f"sqlite:{tmp_path / 'ledger.db'}"
    retry = RetryPolicy(attempts=200, initial_backoff_s=0.02, max_backoff_s=0.1)
    with start_ledger(store=store, port=port, log_dir=tmp_path) as first:
        client = LedgerClient(first.address, retry=retry)
        await _running(client, f"{uid}-a", f"{uid}-b")
        assert await _appender(client, f"{uid}-a", 10) == list(range(1, 11))
        await asyncio.gather(_appender(client, f"{uid}-a", 5), _appender(client, f"{uid}-b", 5))
        assert client.append_streams_opened == 1
        first.kill()
    with start_ledger(store=store, port=port, log_dir=tmp_path):
        reply = await client.append_events([reward(f"{uid}-a", 99.0)])
        assert list(reply.sequences) == [16]
        assert client.append_streams_opened >= 2
        assert (await _rewards(client, f"{uid}-a"))[-1] == 99.0
        await client.close()


async def test_an_append_the_ledger_does_not_answer_in_time_fails_and_the_stream_goes_on(tmp_path: Path, uid: str):
    """The ledger process is stopped (SIGSTOP: connection open, nothing answers): the append fails with
    DEADLINE_EXCEEDED after the call timeout; once the ledger runs again, appends work and the late one is there."""
    with start_ledger(log_dir=tmp_path) as led:
        async with LedgerClient(led.address, call_timeout_s=0.5) as client:
            rid = f"{uid}-r"
            await _running(client, rid)
            await client.append_events([reward(rid, 0.0)])
            led.proc.send_signal(signal.SIGSTOP)
            try:
                started = time.monotonic()
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await client.append_events([reward(rid, 1.0, event_id=f"{rid}-late")])
                assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                assert 0.4 < time.monotonic() - started < 5
            finally:
                led.proc.send_signal(signal.SIGCONT)
            reply = await client.append_events([reward(rid, 2.0)])
            assert list(reply.sequences) == [3]  # the late append was stored when the ledger woke up
            assert await _rewards(client, rid) == [0.0, 1.0, 2.0]


async def test_the_call_timeout_bounds_the_wait_in_the_queue_too(tmp_path: Path, uid: str):
    """One append in flight to a stopped ledger, a second queued behind it: both fail with DEADLINE_EXCEEDED after
    one call timeout (not two), and the queued one, never sent, is not stored."""
    with start_ledger(log_dir=tmp_path) as led:
        # Two timeouts would take 4 s: the bound below leaves 1.6 s for a loaded machine's scheduling (with a 0.6 s
        # timeout and a 1.1 s bound, it failed at a load average of 14 on 2 cores).
        async with LedgerClient(led.address, call_timeout_s=2.0) as client:
            rid = f"{uid}-r"
            await _running(client, rid)
            await client.append_events([reward(rid, 0.0)])
            before = client.append_requests
            led.proc.send_signal(signal.SIGSTOP)
            try:
                started = time.monotonic()
                in_flight = asyncio.create_task(client.append_events([reward(rid, 1.0)]))
                while client.append_requests == before:
                    await asyncio.sleep(0)
                queued = asyncio.create_task(client.append_events([reward(rid, 9.0)]))
                results = await asyncio.gather(in_flight, queued, return_exceptions=True)
                elapsed = time.monotonic() - started
                assert [r.code() for r in results] == [grpc.StatusCode.DEADLINE_EXCEEDED] * 2  # type: ignore[union-attr]
                assert 1.9 < elapsed < 3.6, elapsed  # one timeout for both, the queued wait included
            finally:
                led.proc.send_signal(signal.SIGCONT)
            reply = await client.append_events([reward(rid, 2.0)])
            assert list(reply.sequences) == [3]
            assert await _rewards(client, rid) == [0.0, 1.0, 2.0]  # 9.0 was never sent


async def test_a_wrong_key_fails_appends_at_once(tmp_path: Path):
    with start_ledger(key="right-key", log_dir=tmp_path) as led:
        client = LedgerClient(led.address, "wrong-key", retry=RetryPolicy(attempts=1000, max_backoff_s=0.05))
        try:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await asyncio.wait_for(client.append_events([reward("ro-x", 1.0)]), 10)
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert client.append_streams_opened == 1  # not retried: another try cannot succeed
        finally:
            await client.close()


async def test_a_call_over_the_ledger_limit_fails_alone(tmp_path: Path, uid: str):
    """A call too large for one stream message goes as a unary call, so the ledger refusing its size fails that
    call only: the appends sharing the stream are answered."""
    with start_ledger(log_dir=tmp_path, extra_args=["--max-message-mb", "1"]) as led:
        async with LedgerClient(led.address) as client:
            ids = [f"{uid}-{i}" for i in range(8)]
            await _running(client, *ids)
            huge = custom(ids[0], '"' + "x" * (1536 * 1024) + '"')
            results = await asyncio.gather(
                client.append_events([huge]),
                *(_appender(client, rid, 3) for rid in ids),
                return_exceptions=True,
            )
            error = results.pop(0)
            assert isinstance(error, grpc.aio.AioRpcError) and error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert results == [[1, 2, 3]] * 8
            assert client.append_streams_opened == 1
            assert await _rewards(client, ids[0]) == [0.0, 1.0, 2.0]


def test_append_request_bytes_concatenate_into_one_request():
    """What the merging relies on: serialized AppendEventsRequests concatenate into one with all their events."""
    from services._gen.agl.v1 import ledger_service_pb2 as pb

    parts = [
        pb.AppendEventsRequest(events=[reward("a", 1.0), reward("b", 2.0)], allow_terminal=True),
        pb.AppendEventsRequest(events=[event_pb2.Event(rollout_id="c", event_type="x", data_json="{}")],
                               allow_terminal=True),
    ]  # fmt: skip
    merged = pb.AppendEventsRequest.FromString(b"".join(p.SerializeToString() for p in parts))
    assert [e.rollout_id for e in merged.events] == ["a", "b", "c"] and merged.allow_terminal


async def test_appends_work_without_a_call_timeout(ledger_proc: ServiceProcess, uid: str):
    async with LedgerClient(ledger_proc.address, call_timeout_s=None) as client:
        rid = f"{uid}-r"
        await _running(client, rid)
        replies = await asyncio.gather(*(client.append_events([reward(rid, float(k))]) for k in range(3)))
        assert sorted(s for r in replies for s in r.sequences) == [1, 2, 3]
