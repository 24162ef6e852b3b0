"""Operations of a real ledger: auth, health, reflection, message limits, slow consumers, metrics, SIGTERM."""

from __future__ import annotations

import asyncio
import re
import signal
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from services._gen.agl.v1 import ledger_service_pb2 as pb
from services._gen.agl.v1 import ledger_service_pb2_grpc
from tests.support.procs import free_port, start_ledger

from .conftest import STORES, store_arg
from .support import QUEUING, create, expect_error, spec

KEY = "s3cret-key"


async def test_auth_required_except_health(tmp_path):
    with start_ledger(key=KEY, log_dir=tmp_path) as led:
        async with grpc.aio.insecure_channel(led.address) as channel:
            stub = ledger_service_pb2_grpc.LedgerServiceStub(channel)
            request = pb.GetRolloutRequest(rollout_id="x")
            details = await expect_error(grpc.StatusCode.UNAUTHENTICATED, stub.GetRollout(request))
            assert "bearer" in details.lower()
            await expect_error(
                grpc.StatusCode.UNAUTHENTICATED,
                stub.GetRollout(request, metadata=(("authorization", "Bearer wrong"),)),
            )
            stream = stub.WatchRollouts(pb.WatchRolloutsRequest())
            await expect_error(grpc.StatusCode.UNAUTHENTICATED, stream.read())
            appends = stub.StreamAppendEvents()
            await expect_error(grpc.StatusCode.UNAUTHENTICATED, appends.read())
            good = (("authorization", f"Bearer {KEY}"),)
            await expect_error(grpc.StatusCode.NOT_FOUND, stub.GetRollout(request, metadata=good))
            created = await stub.CreateRollouts(pb.CreateRolloutsRequest(rollouts=[spec("r")]), metadata=good)
            assert created.created[0]
            health = health_pb2_grpc.HealthStub(channel)
            reply = await health.Check(health_pb2.HealthCheckRequest())
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        assert "auth=bearer key" in led.log_text()
        assert KEY not in led.log_text()


async def test_reflection_lists_services(ledger_proc):
    async with grpc.aio.insecure_channel(ledger_proc.address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        call = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
        reply = await call.read()
        names = {s.name for s in reply.list_services_response.service}
        assert {"agl.v1.LedgerService", "grpc.health.v1.Health"} <= names
        call.cancel()
        call = stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(file_containing_symbol="agl.v1.LedgerService")])
        )
        reply = await call.read()
        assert reply.file_descriptor_response.file_descriptor_proto
        call.cancel()


async def test_health_serving_then_not_serving_on_sigterm(tmp_path):
    with start_ledger(log_dir=tmp_path, extra_args=["--grace-seconds", "1"]) as led:
        async with grpc.aio.insecure_channel(led.address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for service in ("", "agl.v1.LedgerService"):
                reply = await health.Check(health_pb2.HealthCheckRequest(service=service))
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
            watch = health.Watch(health_pb2.HealthCheckRequest(service="agl.v1.LedgerService"))
            assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
            led.proc.send_signal(signal.SIGTERM)
            reply = await asyncio.wait_for(watch.read(), 10)
            assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
            watch.cancel()
        assert await asyncio.to_thread(led.proc.wait, 20) == 0


@pytest.mark.parametrize("kind", STORES)
async def test_sigterm_finishes_in_flight_writes_and_ends_streams(tmp_path, kind):
    store = store_arg(kind, tmp_path)
    with start_ledger(store=store, log_dir=tmp_path) as led:
        async with grpc.aio.insecure_channel(led.address) as channel:
            stub = ledger_service_pb2_grpc.LedgerServiceStub(channel)
            watch = stub.WatchRollouts(pb.WatchRolloutsRequest())
            assert (await watch.read()).type == pb.ROLLOUT_CHANGE_TYPE_SYNCED
            writes = [create(stub, *[f"r{i}-{j}" for j in range(20)]) for i in range(20)]
            pending = asyncio.gather(*writes, return_exceptions=True)
            await asyncio.sleep(0.05)
            led.proc.send_signal(signal.SIGTERM)
            results = await pending
            acknowledged = {r.rollout_id for result in results if isinstance(result, list) for r in result}
            # The open stream is ended with UNAVAILABLE (clients reconnect), not left hanging.
            with pytest.raises(grpc.aio.AioRpcError) as info:
                while True:
                    message = await asyncio.wait_for(watch.read(), 20)
                    assert message is not grpc.aio.EOF
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert await asyncio.to_thread(led.proc.wait, 20) == 0
        assert "ledger stopped" in led.log_text()
    if kind == "sqlite":
        with start_ledger(store=store, log_dir=tmp_path) as again:
            async with grpc.aio.insecure_channel(again.address) as channel:
                stub = ledger_service_pb2_grpc.LedgerServiceStub(channel)
                listed = await stub.ListRollouts(pb.ListRolloutsRequest(page_size=1000))
                assert acknowledged <= {r.rollout_id for r in listed.rollouts}


async def test_message_size_limit(tmp_path):
    with start_ledger(log_dir=tmp_path, extra_args=["--max-message-mb", "1"]) as led:
        async with grpc.aio.insecure_channel(
            led.address, options=[("grpc.max_send_message_length", 8 * 1024 * 1024)]
        ) as channel:
            stub = ledger_service_pb2_grpc.LedgerServiceStub(channel)
            huge = spec("big", input_json='"' + "x" * (2 * 1024 * 1024) + '"')
            details = await expect_error(
                grpc.StatusCode.RESOURCE_EXHAUSTED, stub.CreateRollouts(pb.CreateRolloutsRequest(rollouts=[huge]))
            )
            assert details
            await expect_error(grpc.StatusCode.NOT_FOUND, stub.GetRollout(pb.GetRolloutRequest(rollout_id="big")))
            assert (await stub.CreateRollouts(pb.CreateRolloutsRequest(rollouts=[spec("small")]))).created[0]


def resume_revision(details: str) -> int:
    match = re.search(r"after_revision=(\d+)", details)
    assert match, details
    return int(match.group(1))


@pytest.mark.parametrize("kind", STORES)
async def test_slow_consumer_is_cut_off_and_resumes(tmp_path, kind):
    total = 600
    blob = '"' + "y" * 2000 + '"'
    with start_ledger(store=store_arg(kind, tmp_path), log_dir=tmp_path, extra_args=["--watch-buffer", "32"]) as led:
        async with (
            # No BDP probing: the slow reader's HTTP/2 window stays small, as for a consumer that stopped reading.
            grpc.aio.insecure_channel(led.address, options=[("grpc.http2.bdp_probe", 0)]) as slow_channel,
            grpc.aio.insecure_channel(led.address) as channel,
        ):
            slow = ledger_service_pb2_grpc.LedgerServiceStub(slow_channel).WatchRollouts(pb.WatchRolloutsRequest())
            assert (await slow.read()).type == pb.ROLLOUT_CHANGE_TYPE_SYNCED
            stub = ledger_service_pb2_grpc.LedgerServiceStub(channel)
            fast = stub.WatchRollouts(pb.WatchRolloutsRequest())
            assert (await fast.read()).type == pb.ROLLOUT_CHANGE_TYPE_SYNCED

            fast_seen: list[str] = []

            async def follow() -> None:
                while len(fast_seen) < total:
                    fast_seen.append((await fast.read()).rollout.rollout_id)

            follower = asyncio.create_task(follow())
            # The slow watcher reads nothing meanwhile; writers are never blocked by it.
            for j in range(total):
                request = pb.CreateRolloutsRequest(rollouts=[spec(f"r{j:05d}", input_json=blob)])
                await asyncio.wait_for(stub.CreateRollouts(request), 30)
            await asyncio.wait_for(follower, 60)
            assert fast_seen == [f"r{j:05d}" for j in range(total)]

            received: list[tuple[int, str]] = []
            with pytest.raises(grpc.aio.AioRpcError) as info:
                while True:
                    message = await asyncio.wait_for(slow.read(), 20)
                    assert message is not grpc.aio.EOF
                    received.append((message.revision, message.rollout.rollout_id))
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            resume = resume_revision(info.value.details())
            assert len(received) < total
            assert resume == (received[-1][0] if received else 0)

            again = ledger_service_pb2_grpc.LedgerServiceStub(slow_channel).WatchRollouts(
                pb.WatchRolloutsRequest(after_revision=resume)
            )
            while True:
                message = await asyncio.wait_for(again.read(), 20)
                if message.type == pb.ROLLOUT_CHANGE_TYPE_SYNCED:
                    break
                assert message.rollout.status.state == QUEUING
                received.append((message.revision, message.rollout.rollout_id))
            again.cancel()
            fast.cancel()
            assert [rid for _, rid in received] == [f"r{j:05d}" for j in range(total)]
            assert [rev for rev, _ in received] == sorted({rev for rev, _ in received})


async def test_metrics_endpoint(tmp_path):
    port = free_port()
    with start_ledger(log_dir=tmp_path, extra_args=["--metrics-port", str(port)]) as led:
        async with grpc.aio.insecure_channel(led.address) as channel:
            stub = ledger_service_pb2_grpc.LedgerServiceStub(channel)
            await create(stub, "a", "b")
            from .support import append, reward

            await append(stub, reward("a", 1.0), reward("b", 0.0))
            text = await asyncio.to_thread(
                lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            )
    assert 'agl_ledger_rollouts{state="queuing"} 2.0' in text
    assert "agl_ledger_events_appended_total 2.0" in text
    assert 'agl_ledger_stream_subscribers{feed="rollouts"}' in text
    assert "agl_ledger_store_commit_seconds" in text
