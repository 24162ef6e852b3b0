"""Controller leases through a real ledger: heartbeats renew them, an expired one is reported to live controllers
while its controller still owns RUNNING rollouts, and a takeover (a compare-and-set claim) is won exactly once."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc

from services._gen.agl.v1 import ledger_service_pb2 as pb
from services._gen.agl.v1 import ledger_service_pb2_grpc
from tests.support.procs import start_ledger

from .support import RUNNING, SUCCEEDED, Stub, create, expect_error, update


async def renew(
    stub: Stub, controller_id: str, ttl: float = 0.0, leaving: bool = False
) -> pb.RenewControllerLeaseResponse:
    request = pb.RenewControllerLeaseRequest(controller_id=controller_id, ttl_seconds=ttl, leaving=leaving)
    return await stub.RenewControllerLease(request)


def expired_ids(reply: pb.RenewControllerLeaseResponse, uid: str) -> dict[str, int]:
    """The expired leases of this test's controllers (the ledger is shared), with their running counts."""
    return {lease.controller_id: lease.running_rollouts for lease in reply.expired_leases if uid in lease.controller_id}


async def test_a_heartbeat_renews_the_lease_with_the_default_ttl(stub, uid):
    before = time.time()
    reply = await renew(stub, f"{uid}-a")
    lease = reply.lease
    assert lease.controller_id == f"{uid}-a" and lease.ttl_seconds == 30.0 and lease.running_rollouts == 0
    renewed = lease.renew_time.ToNanoseconds() / 1e9
    assert before - 1 <= renewed <= time.time() + 1
    assert abs(lease.expire_time.ToNanoseconds() / 1e9 - renewed - 30.0) < 0.01


async def test_an_expired_lease_is_reported_until_its_rollouts_are_taken_over(stub, uid):
    dead, live, idle = f"{uid}-dead", f"{uid}-live", f"{uid}-idle"
    rids = [f"{uid}-r{i}" for i in range(3)]
    await create(stub, *rids)
    await renew(stub, dead, ttl=0.5)
    await renew(stub, idle, ttl=0.5)  # owns nothing: never reported
    for rid in rids:
        await update(stub, rid, RUNNING, attempt_id="a1", controller_id=dead)
    await update(stub, rids[2], SUCCEEDED)  # ended: no longer owned
    assert expired_ids(await renew(stub, live), uid) == {}  # still within its TTL
    await asyncio.sleep(0.7)
    reply = await renew(stub, live)
    assert expired_ids(reply, uid) == {dead: 2}
    (lease,) = [lease for lease in reply.expired_leases if lease.controller_id == dead]
    assert lease.ttl_seconds == 0.5 and lease.expire_time.ToNanoseconds() <= time.time_ns()
    # The dead controller is not told about itself; a takeover claim is a compare-and-set that one caller wins.
    assert dead not in expired_ids(await renew(stub, dead, ttl=0.5), uid)
    await asyncio.sleep(0.7)
    current = (await stub.GetRollout(pb.GetRolloutRequest(rollout_id=rids[0]))).rollout
    version = current.status.version
    claims = await asyncio.gather(
        *(update(stub, rids[0], RUNNING, controller_id=c, expected_version=version) for c in (live, "x")),
        return_exceptions=True,
    )
    assert sum(not isinstance(c, Exception) for c in claims) == 1
    assert sum(isinstance(c, grpc.aio.AioRpcError) and c.code() == grpc.StatusCode.ABORTED for c in claims) == 1
    await update(stub, rids[1], RUNNING, controller_id=live)
    assert expired_ids(await renew(stub, live), uid) == {}  # nothing left to take over
    owned = (await renew(stub, live)).lease.running_rollouts
    assert owned == (1 if not isinstance(claims[0], Exception) else 0) + 1


async def test_leaving_ends_the_lease_at_once(stub, uid):
    going, live = f"{uid}-going", f"{uid}-live"
    await create(stub, f"{uid}-r")
    await renew(stub, going, ttl=60)
    await update(stub, f"{uid}-r", RUNNING, attempt_id="a1", controller_id=going)
    assert expired_ids(await renew(stub, live), uid) == {}
    reply = await renew(stub, going, ttl=60, leaving=True)
    assert reply.lease.running_rollouts == 1
    assert expired_ids(await renew(stub, live), uid) == {going: 1}


async def test_an_owner_that_never_heartbeated_gets_the_grace_first(stub, uid):
    """A controller that predates leases (or claimed before the ledger restarted) is not taken over at once."""
    await create(stub, f"{uid}-r")
    await update(stub, f"{uid}-r", RUNNING, attempt_id="a1", controller_id=f"{uid}-old")
    assert expired_ids(await renew(stub, f"{uid}-live", ttl=0.3), uid) == {}
    await asyncio.sleep(0.5)
    assert expired_ids(await renew(stub, f"{uid}-live", ttl=0.3), uid) == {}


async def test_bad_heartbeats_are_refused(stub, uid):
    details = await expect_error(grpc.StatusCode.INVALID_ARGUMENT, renew(stub, ""))
    assert "controller_id" in details
    details = await expect_error(grpc.StatusCode.INVALID_ARGUMENT, renew(stub, f"{uid}/x"))
    assert "controller_id" in details and f"{uid}/x" in details
    for ttl in (-1.0, 3601.0, float("nan")):
        details = await expect_error(grpc.StatusCode.INVALID_ARGUMENT, renew(stub, f"{uid}-a", ttl=ttl))
        assert "ttl_seconds" in details


async def test_a_restarted_ledger_gives_owners_a_fresh_lease(tmp_path: Path, uid: str):
    store = f"sqlite:{tmp_path / 'ledger.db'}"
    with start_ledger(store=store, log_dir=tmp_path) as ledger:
        async with grpc.aio.insecure_channel(ledger.address) as channel:
            stub = ledger_service_pb2_grpc.LedgerServiceStub(channel)
            await create(stub, f"{uid}-r")
            await renew(stub, f"{uid}-a", ttl=0.3)
            await update(stub, f"{uid}-r", RUNNING, attempt_id="a1", controller_id=f"{uid}-a")
            await asyncio.sleep(0.5)
            assert expired_ids(await renew(stub, f"{uid}-b", ttl=0.3), uid) == {f"{uid}-a": 1}
    with start_ledger(store=store, log_dir=tmp_path) as ledger:
        async with grpc.aio.insecure_channel(ledger.address) as channel:
            stub = ledger_service_pb2_grpc.LedgerServiceStub(channel)
            # The lease died with the old ledger: the owner gets at least the default TTL from now, not zero.
            assert expired_ids(await renew(stub, f"{uid}-b", ttl=0.3), uid) == {}
            assert (await renew(stub, f"{uid}-a", ttl=0.3)).lease.running_rollouts == 1
