"""gRPC health follows the store (real ledger process): SERVING while writes commit, NOT_SERVING while they cannot.

Two real failures: the SQLite file locked by another process (a write waits; health recovers once it commits) and a
full disk (the ledger's file-size limit, as in tests/faults/test_disk_full.py: the store fails and stays failed).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import sqlite3
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services._gen.agl.v1 import event_pb2, rollout_pb2
from services.client import LedgerClient, RetryPolicy
from tests.support.procs import start_ledger

KEY = "ledger-health-key"
SERVICES = ("", "agl.v1.LedgerService")
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def check(address: str, service: str = "") -> int:
    """Health.Check without a key (health is exempt from auth), as kubelet's grpc probe calls it."""
    async with grpc.aio.insecure_channel(address) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=2
        )
        return reply.status


async def wait_status(address: str, status: int, timeout_s: float = 10.0) -> float:
    """Seconds until every service reports `status`."""
    started = time.monotonic()
    while True:
        seen = [await check(address, service) for service in SERVICES]
        if all(s == status for s in seen):
            return time.monotonic() - started
        assert time.monotonic() - started < timeout_s, f"health stayed {seen}, expected {status}"
        await asyncio.sleep(0.05)


def note(rollout_id: str, index: int) -> event_pb2.Event:
    data = json.dumps({"i": index, "pad": "x" * 2000})
    return event_pb2.Event(rollout_id=rollout_id, attempt_id="at-1", event_type="note", data_json=data)


async def start_rollout(client: LedgerClient, rollout_id: str) -> None:
    await client.create_rollouts([rollout_pb2.RolloutSpec(rollout_id=rollout_id, input_json="{}")])
    await client.update_status(rollout_id, rollout_pb2.ROLLOUT_STATE_RUNNING, attempt_id="at-1")


async def test_health_is_not_serving_while_the_sqlite_file_is_locked_and_serving_once_the_write_commits(
    tmp_path: Path,
) -> None:
    db = tmp_path / "ledger.db"
    with start_ledger(store=f"sqlite:{db}", key=KEY, extra_args=["--store-stall-seconds", "0.5"]) as ledger:
        async with LedgerClient(ledger.address, KEY) as client:
            await start_rollout(client, "ro-locked")
            assert [await check(ledger.address, s) for s in SERVICES] == [SERVING, SERVING]

            other = sqlite3.connect(db, isolation_level=None)
            other.execute("BEGIN IMMEDIATE")  # another process holds the write lock: the ledger's commit waits
            try:
                append = asyncio.create_task(client.append_events([note("ro-locked", 1)], timeout_s=30))
                down_s = await wait_status(ledger.address, NOT_SERVING)
                assert not append.done()  # not acknowledged while it is not stored
                assert await check(ledger.address, "liveness") == SERVING  # alive, just not ready
            finally:
                other.execute("ROLLBACK")
                other.close()
            await asyncio.wait_for(append, 15)
            up_s = await wait_status(ledger.address, SERVING)
            stored = await client.list_events("ro-locked", event_type="note")
        assert [json.loads(e.data_json)["i"] for e in stored] == [1]
        log = ledger.log_text()
    assert "NOT_SERVING: a write has waited" in log and "SERVING again" in log, log
    print(f"locked store: NOT_SERVING {down_s:.2f}s after the lock, SERVING {up_s:.2f}s after it was released")


async def test_a_lock_held_past_sqlites_busy_timeout_is_waited_out_not_a_stop(tmp_path: Path) -> None:
    """Issue 30 finding 4: a lock held longer than SQLite's 10 s busy timeout stopped the ledger (exit 1, its
    writes failed). The writer now tries the same transaction again until the lock is released."""
    db = tmp_path / "ledger.db"
    args = ["--store-stall-seconds", "0.5"]
    with start_ledger(store=f"sqlite:{db}", key=KEY, extra_args=args) as ledger:
        async with LedgerClient(ledger.address, KEY) as client:
            await start_rollout(client, "ro-long-lock")
            other = sqlite3.connect(db, isolation_level=None)
            other.execute("BEGIN IMMEDIATE")
            try:
                append = asyncio.create_task(client.append_events([note("ro-long-lock", 1)], timeout_s=60))
                await wait_status(ledger.address, NOT_SERVING)
                await asyncio.sleep(11.5)  # past the old 10 s
                assert ledger.alive(), ledger.log_text()
                assert not append.done()
                assert await check(ledger.address, "liveness") == SERVING
            finally:
                other.execute("ROLLBACK")
                other.close()
            await asyncio.wait_for(append, 15)
            await wait_status(ledger.address, SERVING)
            # Writes after it go through as usual.
            await client.append_events([note("ro-long-lock", 2)], timeout_s=10)
            stored = await client.list_events("ro-long-lock", event_type="note")
        assert [json.loads(e.data_json)["i"] for e in stored] == [1, 2]
        log = ledger.log_text()
    assert "is locked by another process" in log and "the lock was released" in log, log
    assert "refusing further writes" not in log, log


async def test_a_shutdown_while_the_file_is_locked_stops_within_its_grace_and_refuses_the_waiting_write(
    tmp_path: Path,
) -> None:
    db = tmp_path / "ledger.db"
    args = ["--store-stall-seconds", "0.5", "--grace-seconds", "1"]
    with start_ledger(store=f"sqlite:{db}", key=KEY, extra_args=args) as ledger:
        async with LedgerClient(ledger.address, KEY, retry=RetryPolicy(attempts=1)) as client:
            await start_rollout(client, "ro-lock-stop")
            await client.append_events([note("ro-lock-stop", 0)])
            other = sqlite3.connect(db, isolation_level=None)
            other.execute("BEGIN IMMEDIATE")
            try:
                append = asyncio.create_task(client.append_events([note("ro-lock-stop", 1)], timeout_s=60))
                await wait_status(ledger.address, NOT_SERVING)
                stopping = time.monotonic()
                ledger.proc.terminate()
                with contextlib.suppress(grpc.aio.AioRpcError):
                    await asyncio.wait_for(append, 15)
                await asyncio.to_thread(ledger.proc.wait, 15)
                stop_s = time.monotonic() - stopping
            finally:
                other.execute("ROLLBACK")
                other.close()
        assert append.exception() is not None  # never acknowledged: it was not stored
        log = ledger.log_text()
    assert stop_s < 1 + 5, (stop_s, log)
    assert "still locked by another process at shutdown" in log, log
    # The file holds what was acknowledged, and nothing else.
    with start_ledger(store=f"sqlite:{db}", key=KEY) as ledger:
        async with LedgerClient(ledger.address, KEY) as client:
            stored = await client.list_events("ro-lock-stop", event_type="note")
    assert [json.loads(e.data_json)["i"] for e in stored] == [0]
    print(f"shutdown with the file locked: stopped in {stop_s:.2f}s")


async def test_health_is_not_serving_once_a_full_disk_fails_the_store(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    with start_ledger(store=f"sqlite:{db}", key=KEY) as ledger:
        async with (
            LedgerClient(ledger.address, KEY, retry=RetryPolicy(attempts=1)) as client,
            grpc.aio.insecure_channel(ledger.address) as channel,
        ):
            await start_rollout(client, "ro-full")
            await client.append_events([note("ro-full", 0)])
            watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""))
            assert (await watch.read()).status == SERVING

            limit = max(p.stat().st_size for p in tmp_path.glob("ledger.db*")) + 4096
            resource.prlimit(ledger.proc.pid, resource.RLIMIT_FSIZE, (limit, limit))
            error = ""
            for index in range(1, 4000):
                try:
                    await client.append_events([note("ro-full", index)], timeout_s=10)
                except grpc.aio.AioRpcError as err:
                    error = f"{err.code().name}: {err.details()}"
                    break
            assert error.startswith("UNAVAILABLE"), error
            # The stream told NOT_SERVING before it ended, and a Check now never says SERVING.
            assert (await asyncio.wait_for(watch.read(), 5)).status == NOT_SERVING
            try:
                after = await check(ledger.address)
            except grpc.aio.AioRpcError as err:
                after = err.code()  # the ledger may already have stopped listening
            assert after in (NOT_SERVING, grpc.StatusCode.UNAVAILABLE), after
        ledger.proc.wait(timeout=30)
        log = ledger.log_text()
    assert ledger.proc.returncode == 1, log
    assert "health: NOT_SERVING: the store failed" in log, log
    assert log.index("health: NOT_SERVING") < log.index("ledger shutting down"), log
