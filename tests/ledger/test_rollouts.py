"""Rollouts through a real ledger (both stores): create, get, list, delete, the state machine, compare-and-set."""

from __future__ import annotations

import asyncio
import itertools

import grpc
import pytest

from services._gen.agl.v1 import ledger_service_pb2 as pb
from services._gen.agl.v1 import rollout_pb2

from .support import (
    FAILED,
    QUEUING,
    RUNNING,
    SUCCEEDED,
    append,
    create,
    expect_error,
    list_events,
    reward,
    spec,
    update,
)

STATES = [QUEUING, RUNNING, SUCCEEDED, FAILED]
LEGAL = {(QUEUING, RUNNING), (QUEUING, FAILED), (RUNNING, RUNNING), (RUNNING, SUCCEEDED), (RUNNING, FAILED)}
NAMES = {QUEUING: "queuing", RUNNING: "running", SUCCEEDED: "succeeded", FAILED: "failed"}


async def test_create_get_and_idempotent_retry(stub, uid):
    first = await stub.CreateRollouts(pb.CreateRolloutsRequest(rollouts=[spec(f"{uid}-a"), spec(f"{uid}-b")]))
    assert list(first.created) == [True, True]
    a = first.rollouts[0]
    assert (a.rollout_id, a.input_json, a.status.state, a.status.version) == (f"{uid}-a", '{"q": 1}', QUEUING, 1)
    assert a.status.create_time.seconds > 0 and a.status.revision > 0

    # A retry after a lost response creates nothing twice, and does not clobber a rollout that moved on.
    await update(stub, f"{uid}-a", RUNNING, attempt_id="att-1")
    retry = await stub.CreateRollouts(
        pb.CreateRolloutsRequest(rollouts=[spec(f"{uid}-a", input_json='{"q": 2}'), spec(f"{uid}-b"), spec(f"{uid}-c")])
    )
    assert list(retry.created) == [False, False, True]
    assert retry.rollouts[0].status.state == RUNNING and retry.rollouts[0].input_json == '{"q": 1}'
    got = await stub.GetRollout(pb.GetRolloutRequest(rollout_id=f"{uid}-a"))
    assert got.rollout.status.attempt_id == "att-1" and got.rollout.status.version == 2


async def test_create_assigns_id_when_empty(stub):
    reply = await stub.CreateRollouts(pb.CreateRolloutsRequest(rollouts=[spec("")]))
    assert reply.created[0] and len(reply.rollouts[0].rollout_id) >= 16


async def test_unknown_rollout_is_not_found(stub, uid):
    details = await expect_error(
        grpc.StatusCode.NOT_FOUND, stub.GetRollout(pb.GetRolloutRequest(rollout_id=f"{uid}-nope"))
    )
    assert f"{uid}-nope" in details
    await expect_error(
        grpc.StatusCode.NOT_FOUND,
        stub.UpdateRolloutStatus(pb.UpdateRolloutStatusRequest(rollout_id=f"{uid}-x", state=RUNNING)),
    )


async def test_invalid_json_is_rejected_naming_the_field(stub, uid):
    bad = rollout_pb2.RolloutSpec(rollout_id=f"{uid}-bad", input_json="{not json")
    details = await expect_error(
        grpc.StatusCode.INVALID_ARGUMENT,
        stub.CreateRollouts(pb.CreateRolloutsRequest(rollouts=[spec(f"{uid}-ok"), bad])),
    )
    assert "input_json" in details
    # The batch is atomic: the valid item was not created either.
    await expect_error(grpc.StatusCode.NOT_FOUND, stub.GetRollout(pb.GetRolloutRequest(rollout_id=f"{uid}-ok")))


@pytest.mark.parametrize(("source", "target"), list(itertools.product(STATES, STATES)))
async def test_every_transition(stub, uid, source, target):
    rid = f"{uid}-{source}-{target}"
    await create(stub, rid)
    path = {QUEUING: [], RUNNING: [RUNNING], SUCCEEDED: [RUNNING, SUCCEEDED], FAILED: [FAILED]}[source]
    for state in path:
        await update(stub, rid, state, attempt_id="att")
    if (source, target) in LEGAL:
        before = (await stub.GetRollout(pb.GetRolloutRequest(rollout_id=rid))).rollout
        after = await update(stub, rid, target, error_message="boom" if target == FAILED else "")
        assert after.status.state == target
        assert after.status.version == before.status.version + 1
        assert after.status.revision > before.status.revision
        if target in (SUCCEEDED, FAILED):
            assert after.status.end_time.seconds > 0
        if target == FAILED:
            assert after.status.error_message == "boom"
    else:
        details = await expect_error(grpc.StatusCode.FAILED_PRECONDITION, update(stub, rid, target))
        assert NAMES[source] in details and NAMES[target] in details and rid in details


async def test_unspecified_target_state_is_invalid(stub, uid):
    await create(stub, f"{uid}-r")
    await expect_error(
        grpc.StatusCode.INVALID_ARGUMENT, update(stub, f"{uid}-r", rollout_pb2.ROLLOUT_STATE_UNSPECIFIED)
    )


async def test_claim_fields_and_compare_and_set(stub, uid):
    rid = f"{uid}-cas"
    await create(stub, rid)
    details = await expect_error(grpc.StatusCode.ABORTED, update(stub, rid, RUNNING, expected_version=7))
    assert "version is 1" in details and "7" in details
    claimed = await update(
        stub, rid, RUNNING, expected_version=1, attempt_id="a1", launcher_ref="pid:42", controller_id="c1"
    )
    status = claimed.status
    assert (status.attempt_id, status.launcher_ref, status.controller_id, status.version) == ("a1", "pid:42", "c1", 2)
    assert status.start_time.seconds > 0
    # running -> running keeps what is not given and updates the launcher handle.
    relaunched = await update(stub, rid, RUNNING, launcher_ref="job-x", expected_version=2)
    assert (relaunched.status.attempt_id, relaunched.status.launcher_ref) == ("a1", "job-x")


async def test_two_concurrent_claimers_exactly_one_wins(stub, uid):
    ids = [f"{uid}-{i}" for i in range(10)]
    await create(stub, *ids)

    async def claim(rid: str, who: str) -> str | None:
        try:
            await update(stub, rid, RUNNING, expected_version=1, controller_id=who, attempt_id=who)
            return who
        except grpc.aio.AioRpcError as err:
            assert err.code() in (grpc.StatusCode.ABORTED, grpc.StatusCode.FAILED_PRECONDITION), err.details()
            return None

    for rid in ids:
        results = await asyncio.gather(claim(rid, "c1"), claim(rid, "c2"))
        winners = [w for w in results if w]
        assert len(winners) == 1
        stored = (await stub.GetRollout(pb.GetRolloutRequest(rollout_id=rid))).rollout
        assert stored.status.controller_id == winners[0] and stored.status.version == 2


async def test_list_filters_and_pages(stub, uid):
    ids = [f"{uid}-{i:02d}" for i in range(25)]
    await create(stub, *ids, labels={"run": uid, "step": "1"})
    await create(stub, f"{uid}-other", labels={"run": uid, "step": "2"})
    for rid in ids[:5]:
        await update(stub, rid, RUNNING, controller_id="ctl-a")

    seen: list[str] = []
    token = ""
    pages = 0
    while True:
        reply = await stub.ListRollouts(
            pb.ListRolloutsRequest(label_selector={"run": uid, "step": "1"}, page_size=10, page_token=token)
        )
        seen += [r.rollout_id for r in reply.rollouts]
        pages += 1
        token = reply.next_page_token
        if not token:
            break
    assert seen == ids and pages == 3

    running = await stub.ListRollouts(pb.ListRolloutsRequest(states=[RUNNING], label_selector={"run": uid}))
    assert [r.rollout_id for r in running.rollouts] == ids[:5]
    queued = await stub.ListRollouts(pb.ListRolloutsRequest(states=[QUEUING], label_selector={"run": uid}))
    assert len(queued.rollouts) == 21
    mine = await stub.ListRollouts(pb.ListRolloutsRequest(controller_id="ctl-a", label_selector={"run": uid}))
    assert len(mine.rollouts) == 5
    await expect_error(
        grpc.StatusCode.INVALID_ARGUMENT, stub.ListRollouts(pb.ListRolloutsRequest(page_token="garbage"))
    )


async def test_delete_is_idempotent_and_removes_events(stub, uid):
    rid = f"{uid}-del"
    await create(stub, rid)
    await append(stub, reward(rid, 1.0))
    assert len(await list_events(stub, rid)) == 1
    reply = await stub.DeleteRollouts(pb.DeleteRolloutsRequest(rollout_ids=[rid, f"{uid}-never"]))
    assert reply.deleted_count == 1
    again = await stub.DeleteRollouts(pb.DeleteRolloutsRequest(rollout_ids=[rid]))
    assert again.deleted_count == 0
    await expect_error(grpc.StatusCode.NOT_FOUND, stub.ListEvents(pb.ListEventsRequest(rollout_id=rid)))
    # Re-creating the id starts a fresh rollout with no events.
    await create(stub, rid)
    assert await list_events(stub, rid) == []
