"""Streams through a real ledger (both stores): rollout watch with resume, terminal feed, models, proxy control."""

from __future__ import annotations

import asyncio
import random
import re

import grpc

from services._gen.agl.v1 import ledger_service_pb2 as pb
from services._gen.agl.v1 import model_pb2

from .support import FAILED, QUEUING, RUNNING, SUCCEEDED, append, create, expect_error, model_request, reward, update

SNAPSHOT = pb.ROLLOUT_CHANGE_TYPE_SNAPSHOT
SYNCED = pb.ROLLOUT_CHANGE_TYPE_SYNCED
UPSERT = pb.ROLLOUT_CHANGE_TYPE_UPSERT
DELETE = pb.ROLLOUT_CHANGE_TYPE_DELETE
READ_TIMEOUT = 20


async def read(call):
    message = await asyncio.wait_for(call.read(), READ_TIMEOUT)
    assert message is not grpc.aio.EOF
    return message


async def test_watch_snapshot_then_changes(stub, uid):
    labels = {"run": uid}
    await create(stub, f"{uid}-1", f"{uid}-2", f"{uid}-3", labels=labels)
    await update(stub, f"{uid}-3", RUNNING)
    call = stub.WatchRollouts(pb.WatchRolloutsRequest(states=[QUEUING], label_selector=labels))
    try:
        snapshot = [await read(call), await read(call)]
        assert [m.type for m in snapshot] == [SNAPSHOT, SNAPSHOT]
        assert sorted(m.rollout.rollout_id for m in snapshot) == [f"{uid}-1", f"{uid}-2"]
        synced = await read(call)
        assert synced.type == SYNCED and not synced.HasField("rollout")

        await update(stub, f"{uid}-1", RUNNING)  # leaves the filter: sent once, with its new state
        await update(stub, f"{uid}-1", SUCCEEDED)  # outside the filter before and after: not sent
        await update(stub, f"{uid}-3", FAILED)  # likewise
        await create(stub, f"{uid}-4", labels=labels)
        await create(stub, f"{uid}-x", labels={"run": "someone-else"})
        await stub.DeleteRollouts(pb.DeleteRolloutsRequest(rollout_ids=[f"{uid}-2"]))
        left, created, deleted = await read(call), await read(call), await read(call)
        assert (left.type, left.rollout.rollout_id, left.rollout.status.state) == (UPSERT, f"{uid}-1", RUNNING)
        assert (created.type, created.rollout.rollout_id) == (UPSERT, f"{uid}-4")
        assert (deleted.type, deleted.rollout.rollout_id) == (DELETE, f"{uid}-2")
        assert not deleted.rollout.HasField("status")
        assert synced.revision < left.revision < created.revision < deleted.revision
    finally:
        call.cancel()


async def test_watch_resume_misses_nothing_and_repeats_nothing(stub, uid):
    labels = {"run": uid}
    total = 120
    ids = [f"{uid}-{i:03d}" for i in range(total)]

    async def writer() -> None:
        for i, rid in enumerate(ids):
            await create(stub, rid, labels=labels)
            if i % 3 == 0:
                await update(stub, rid, RUNNING)
        await create(stub, f"{uid}-done", labels=labels)

    revision = 0
    seen_revisions: list[int] = []
    changes: list[tuple[str, int]] = []
    rng = random.Random(7)
    write_task: asyncio.Task[None] | None = None
    finished = False
    while not finished:
        call = stub.WatchRollouts(pb.WatchRolloutsRequest(label_selector=labels, after_revision=revision))
        budget = rng.randint(1, 25)  # disconnect after a random number of messages
        try:
            while budget > 0:
                message = await read(call)
                if message.type == SYNCED:
                    revision = max(revision, message.revision)
                    if write_task is None:
                        write_task = asyncio.create_task(writer())
                    continue
                assert message.type == UPSERT
                seen_revisions.append(message.revision)
                changes.append((message.rollout.rollout_id, message.rollout.status.state))
                revision = message.revision
                budget -= 1
                if message.rollout.rollout_id == f"{uid}-done":
                    finished = True
                    break
        finally:
            call.cancel()
    assert write_task is not None
    await write_task
    assert seen_revisions == sorted(set(seen_revisions)), "a revision was delivered twice or out of order"
    expected: list[tuple[str, int]] = []
    for i, rid in enumerate(ids):
        expected.append((rid, QUEUING))
        if i % 3 == 0:
            expected.append((rid, RUNNING))
    assert changes == [*expected, (f"{uid}-done", QUEUING)]


async def test_watch_from_unknown_revision_is_out_of_range(stub):
    call = stub.WatchRollouts(pb.WatchRolloutsRequest(after_revision=10**12))
    details = await expect_error(grpc.StatusCode.OUT_OF_RANGE, call.read())
    assert "start over" in details


async def finish(stub, rid: str, state: int, value: float) -> None:
    await update(stub, rid, RUNNING, attempt_id="a")
    await append(stub, model_request(rid, [1, 2], [3], [-0.5]), reward(rid, value))
    await update(stub, rid, state)


async def test_terminal_log_pages_in_completion_order(stub, uid):
    labels = {"run": uid}
    ids = [f"{uid}-{i}" for i in range(7)]
    await create(stub, *ids, labels=labels)
    await create(stub, f"{uid}-elsewhere", labels={"run": "other"})
    order = [ids[i] for i in (3, 0, 6, 1, 5, 2, 4)]
    for n, rid in enumerate(order):
        await finish(stub, rid, SUCCEEDED if n % 2 == 0 else FAILED, float(n))
    await finish(stub, f"{uid}-elsewhere", SUCCEEDED, 9.0)

    got: list[str] = []
    cursors: list[int] = []
    after = 0
    while True:
        page = await stub.ListTerminalRollouts(
            pb.ListTerminalRolloutsRequest(after_cursor=after, label_selector=labels, page_size=3, include_events=True)
        )
        if not page.entries:
            break
        for entry in page.entries:
            got.append(entry.rollout.rollout_id)
            cursors.append(entry.cursor)
            assert [e.event_type for e in entry.events] == ["model_request", "reward"]
        assert page.next_cursor >= page.entries[-1].cursor
        after = page.next_cursor
    assert got == order
    assert cursors == sorted(set(cursors))
    # Without events asked, none are attached.
    page = await stub.ListTerminalRollouts(pb.ListTerminalRolloutsRequest(label_selector=labels, page_size=1))
    assert len(page.entries) == 1 and not page.entries[0].events
    await expect_error(
        grpc.StatusCode.OUT_OF_RANGE, stub.ListTerminalRollouts(pb.ListTerminalRolloutsRequest(after_cursor=10**12))
    )


async def test_watch_terminal_resumes_from_cursor(stub, uid):
    labels = {"run": uid}
    ids = [f"{uid}-{i}" for i in range(5)]
    await create(stub, *ids, labels=labels)
    for rid in ids[:3]:
        await finish(stub, rid, SUCCEEDED, 1.0)

    call = stub.WatchTerminalRollouts(pb.WatchTerminalRolloutsRequest(label_selector=labels, include_events=True))
    first = await read(call)
    call.cancel()
    assert first.entry.rollout.rollout_id == ids[0]
    assert [e.reward.value for e in first.entry.events if e.event_type == "reward"] == [1.0]

    call = stub.WatchTerminalRollouts(
        pb.WatchTerminalRolloutsRequest(after_cursor=first.entry.cursor, label_selector=labels)
    )
    try:
        replay = [await read(call), await read(call)]
        assert [m.entry.rollout.rollout_id for m in replay] == ids[1:3]
        await finish(stub, ids[4], FAILED, 0.0)  # live, delivered as it completes
        live = await read(call)
        assert live.entry.rollout.rollout_id == ids[4] and live.entry.rollout.status.state == FAILED
        assert live.entry.cursor > replay[-1].entry.cursor
        assert not live.entry.events
    finally:
        call.cancel()
    late = stub.WatchTerminalRollouts(pb.WatchTerminalRolloutsRequest(after_cursor=10**12))
    await expect_error(grpc.StatusCode.OUT_OF_RANGE, late.read())


async def test_models_register_list_watch_delete(stub, uid):
    name = f"model-{uid}"
    call = stub.WatchModels(pb.WatchModelsRequest(model_name=name))
    try:
        initial = await read(call)
        assert list(initial.endpoints) == []
        a = model_pb2.ModelEndpoint(model_name=name, endpoint="http://a:8000/v1", version=1)
        b = model_pb2.ModelEndpoint(model_name=name, endpoint="http://b:8000/v1", version=1)
        await stub.RegisterModels(pb.RegisterModelsRequest(endpoints=[a, b]))
        registered = await read(call)
        assert sorted(e.endpoint for e in registered.endpoints) == [a.endpoint, b.endpoint]
        assert registered.revision > initial.revision

        a.version = 2
        await stub.RegisterModels(pb.RegisterModelsRequest(endpoints=[a]))  # upsert by (name, endpoint)
        upserted = await read(call)
        assert {e.endpoint: e.version for e in upserted.endpoints} == {a.endpoint: 2, b.endpoint: 1}
        listed = await stub.ListModels(pb.ListModelsRequest(model_name=name))
        assert [(e.endpoint, e.version) for e in listed.endpoints] == [(a.endpoint, 2), (b.endpoint, 1)]
        assert all(e.update_time.seconds > 0 for e in listed.endpoints)

        one = await stub.DeleteModels(
            pb.DeleteModelsRequest(keys=[model_pb2.ModelEndpointKey(model_name=name, endpoint=b.endpoint)])
        )
        assert one.deleted_count == 1
        assert [e.endpoint for e in (await read(call)).endpoints] == [a.endpoint]
        rest = await stub.DeleteModels(pb.DeleteModelsRequest(keys=[model_pb2.ModelEndpointKey(model_name=name)]))
        assert rest.deleted_count == 1
        assert list((await read(call)).endpoints) == []
    finally:
        call.cancel()
    await expect_error(
        grpc.StatusCode.INVALID_ARGUMENT,
        stub.RegisterModels(pb.RegisterModelsRequest(endpoints=[model_pb2.ModelEndpoint(model_name=name)])),
    )


async def test_proxy_control_pause_replicas_and_expiry(stub, uid):
    call = stub.WatchProxyControl(pb.WatchProxyControlRequest())
    try:
        initial = (await read(call)).control
        paused = (await stub.SetProxyPause(pb.SetProxyPauseRequest(paused=True, reason=f"update {uid}"))).control
        assert paused.paused and paused.generation == initial.generation + 1 and paused.retry_after_seconds == 5
        seen = (await read(call)).control
        assert seen.paused and seen.reason == f"update {uid}"

        replica = f"proxy-{uid}"
        await stub.ReportProxyReplica(
            pb.ReportProxyReplicaRequest(
                replica_id=replica, in_flight=3, observed_generation=seen.generation, ttl_seconds=0.5
            )
        )
        reported = (await read(call)).control
        mine = [r for r in reported.replicas if r.replica_id == replica]
        assert len(mine) == 1 and mine[0].in_flight == 3 and mine[0].observed_generation == seen.generation
        # No further report: the replica expires and the watch says so without being asked.
        expired = (await read(call)).control
        assert replica not in [r.replica_id for r in expired.replicas]

        await stub.ReportProxyReplica(pb.ReportProxyReplicaRequest(replica_id=replica, in_flight=0))
        assert replica in [r.replica_id for r in (await read(call)).control.replicas]
        await stub.ReportProxyReplica(pb.ReportProxyReplicaRequest(replica_id=replica, leaving=True))
        assert replica not in [r.replica_id for r in (await read(call)).control.replicas]

        resumed = (await stub.SetProxyPause(pb.SetProxyPauseRequest(paused=False, retry_after_seconds=2))).control
        assert not resumed.paused and resumed.generation == paused.generation + 1
        got = (await stub.GetProxyControl(pb.GetProxyControlRequest())).control
        assert (got.paused, got.generation, got.retry_after_seconds) == (False, resumed.generation, 2)
    finally:
        call.cancel()


def resume_revision(details: str) -> int:
    match = re.search(r"after_revision=(\d+)", details)
    assert match, details
    return int(match.group(1))
