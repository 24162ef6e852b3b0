"""SQLite durability: every acknowledged write survives kill -9, and a restart restores the whole ledger."""

from __future__ import annotations

import asyncio

import grpc

from services._gen.agl.v1 import ledger_service_pb2 as pb
from services._gen.agl.v1 import ledger_service_pb2_grpc, model_pb2
from tests.support.procs import start_ledger

from .support import (
    FAILED,
    QUEUING,
    RUNNING,
    SUCCEEDED,
    append,
    create,
    expect_error,
    list_events,
    model_request,
    reward,
    update,
)


async def test_acknowledged_events_survive_kill_9_under_load(tmp_path):
    store = f"sqlite:{tmp_path / 'ledger.db'}"
    writers = 16
    acked: dict[str, list[tuple[str, int]]] = {f"r{w}": [] for w in range(writers)}
    with start_ledger(store=store, log_dir=tmp_path) as led:
        async with grpc.aio.insecure_channel(led.address) as channel:
            stub = ledger_service_pb2_grpc.LedgerServiceStub(channel)
            await create(stub, *acked)
            stop = asyncio.Event()

            async def write(rid: str) -> None:
                n = 0
                while not stop.is_set():
                    n += 1
                    event_id = f"{rid}-e{n}"
                    event = model_request(rid, [n, n + 1], [n + 2], [-0.5], event_id=event_id)
                    try:
                        reply = await append(stub, event)
                    except grpc.aio.AioRpcError:
                        return  # the ledger died under us: this write was never acknowledged
                    acked[rid].append((event_id, reply.sequences[0]))

            tasks = [asyncio.create_task(write(rid)) for rid in acked]
            while sum(map(len, acked.values())) < 400:
                await asyncio.sleep(0.05)
            led.kill()  # SIGKILL while writes are in flight
            stop.set()
            await asyncio.gather(*tasks)
    total = sum(map(len, acked.values()))
    assert total >= 400

    with start_ledger(store=store, log_dir=tmp_path) as led:
        async with grpc.aio.insecure_channel(led.address) as channel:
            stub = ledger_service_pb2_grpc.LedgerServiceStub(channel)
            for rid, written in acked.items():
                stored = {e.event_id: e.sequence for e in await list_events(stub, rid, page_size=10000)}
                for event_id, seq in written:
                    assert stored.get(event_id) == seq, f"acknowledged event {event_id} (seq {seq}) lost"
                # Sequences stay dense, and the next append continues after the last stored one.
                assert sorted(stored.values()) == list(range(1, len(stored) + 1))
                again = await append(stub, reward(rid, 1.0))
                assert again.sequences[0] == len(stored) + 1
                # A retried append of an acknowledged event is still recognised after the restart.
                if written:
                    event_id, seq = written[-1]
                    n = int(event_id.rsplit("-e", 1)[1])
                    retry = await append(stub, model_request(rid, [n, n + 1], [n + 2], [-0.5], event_id=event_id))
                    assert retry.sequences[0] == seq
                    # ... and the same id with other content is refused, not silently dropped.
                    details = await expect_error(
                        grpc.StatusCode.ALREADY_EXISTS, append(stub, model_request(rid, [0], [0], event_id=event_id))
                    )
                    assert event_id in details


async def test_restart_restores_everything(tmp_path):
    store = f"sqlite:{tmp_path / 'ledger.db'}"
    with start_ledger(store=store, log_dir=tmp_path) as led:
        async with grpc.aio.insecure_channel(led.address) as channel:
            stub = ledger_service_pb2_grpc.LedgerServiceStub(channel)
            await create(stub, "q", "run", "ok", "bad", "gone", labels={"run": "1"})
            await update(stub, "run", RUNNING, attempt_id="a1", controller_id="c1")
            for rid in ("ok", "bad", "gone"):
                await update(stub, rid, RUNNING, attempt_id="a")
                await append(stub, model_request(rid, [1], [2], [-0.1]), reward(rid, 1.0))
            await update(stub, "ok", SUCCEEDED)
            await update(stub, "gone", SUCCEEDED)
            await update(stub, "bad", FAILED, error_message="exit 3")
            await stub.DeleteRollouts(pb.DeleteRolloutsRequest(rollout_ids=["gone"]))
            await stub.RegisterModels(
                pb.RegisterModelsRequest(
                    endpoints=[model_pb2.ModelEndpoint(model_name="m", endpoint="http://e", version=4)]
                )
            )
            await stub.SetProxyPause(pb.SetProxyPauseRequest(paused=True, reason="weights", retry_after_seconds=7))
            before = await stub.ListRollouts(pb.ListRolloutsRequest())
            terminal = await stub.ListTerminalRollouts(pb.ListTerminalRolloutsRequest(include_events=True))
            watch = stub.WatchRollouts(pb.WatchRolloutsRequest())
            revision = [m async for m in _until_synced(watch)][-1].revision
        led.kill()

    with start_ledger(store=store, log_dir=tmp_path) as led:
        async with grpc.aio.insecure_channel(led.address) as channel:
            stub = ledger_service_pb2_grpc.LedgerServiceStub(channel)
            after = await stub.ListRollouts(pb.ListRolloutsRequest())
            assert after == before
            assert await stub.ListTerminalRollouts(pb.ListTerminalRolloutsRequest(include_events=True)) == terminal
            assert [e.cursor for e in terminal.entries] == [1, 3]  # "gone" (cursor 2) was deleted
            models = await stub.ListModels(pb.ListModelsRequest())
            assert [(e.model_name, e.endpoint, e.version) for e in models.endpoints] == [("m", "http://e", 4)]
            control = (await stub.GetProxyControl(pb.GetProxyControlRequest())).control
            assert (control.paused, control.reason, control.retry_after_seconds, control.generation) == (
                True, "weights", 7, 1,
            )  # fmt: skip
            # The revision counter and the terminal cursor continue; a watcher resumes from its revision.
            resumed = stub.WatchRollouts(pb.WatchRolloutsRequest(after_revision=revision))
            assert (await resumed.read()).type == pb.ROLLOUT_CHANGE_TYPE_SYNCED
            created = await create(stub, "new")
            assert created[0].status.revision == revision + 1 and created[0].status.state == QUEUING
            change = await resumed.read()
            assert (change.revision, change.rollout.rollout_id) == (revision + 1, "new")
            resumed.cancel()
            await update(stub, "run", SUCCEEDED)
            page = await stub.ListTerminalRollouts(pb.ListTerminalRolloutsRequest(after_cursor=3))
            assert [(e.cursor, e.rollout.rollout_id) for e in page.entries] == [(4, "run")]


async def _until_synced(call):
    while True:
        message = await call.read()
        yield message
        if message.type == pb.ROLLOUT_CHANGE_TYPE_SYNCED:
            call.cancel()
            return
