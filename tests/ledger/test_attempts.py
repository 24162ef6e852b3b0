"""Attempts with a retry policy, over a real ledger: a failed attempt the policy retries goes back to the queue as a
new attempt of the same rollout; only the final attempt's end enters the terminal log."""

from __future__ import annotations

import grpc
import pytest

from services._gen.agl.v1 import ledger_service_pb2 as pb
from services._gen.agl.v1 import ledger_service_pb2_grpc, rollout_pb2
from tests.support.procs import start_ledger

from .support import (
    FAILED,
    QUEUING,
    RUNNING,
    SUCCEEDED,
    append,
    custom,
    expect_error,
    list_events,
    model_request,
    reward,
    spec,
    update,
)

R = rollout_pb2
KILLED = R.FAILURE_REASON_KILLED
LOST = R.FAILURE_REASON_LOST
EXIT_CODE = R.FAILURE_REASON_EXIT_CODE


async def create_with(stub, rollout_id: str, policy: rollout_pb2.RetryPolicy | None) -> rollout_pb2.Rollout:
    created = spec(rollout_id, labels={"t": rollout_id})
    if policy is not None:
        created.config.retry.CopyFrom(policy)
    reply = await stub.CreateRollouts(pb.CreateRolloutsRequest(rollouts=[created]))
    return reply.rollouts[0]


async def terminal_entries(stub, rollout_id: str) -> list[pb.TerminalRollout]:
    request = pb.ListTerminalRolloutsRequest(label_selector={"t": rollout_id}, include_events=True, page_size=1000)
    return list((await stub.ListTerminalRollouts(request)).entries)


async def test_a_retried_attempt_requeues_and_the_final_attempt_alone_reaches_the_terminal_log(stub, uid: str) -> None:
    rid = f"{uid}-r"
    policy = R.RetryPolicy(max_attempts=3, initial_backoff_seconds=2.0)
    await create_with(stub, rid, policy)
    await update(stub, rid, RUNNING, attempt_id="a1", launcher_ref="pid:1")
    await append(stub, model_request(rid, [1, 2], [3], [-0.1], attempt_id="a1"), reward(rid, 0.0, attempt_id="a1"))

    requeued = await update(stub, rid, FAILED, failure_reason=KILLED, error_message="agent killed by SIGKILL")
    status = requeued.status
    assert status.state == QUEUING and status.attempt_id == "" and status.launcher_ref == ""
    assert status.failure_reason == KILLED and "SIGKILL" in status.error_message
    assert 1.5 < status.retry_time.ToNanoseconds() / 1e9 - status.update_time.ToNanoseconds() / 1e9 < 2.5
    [first] = status.attempts
    assert (first.attempt_id, first.number, first.state, first.failure_reason) == ("a1", 1, FAILED, KILLED)
    assert first.launcher_ref == "pid:1" and first.end_time.seconds > 0
    assert await terminal_entries(stub, rid) == []

    # The next attempt needs a new id; the earlier one's late events are still filed under it.
    details = await expect_error(grpc.StatusCode.FAILED_PRECONDITION, update(stub, rid, RUNNING, attempt_id="a1"))
    assert "a1" in details and "used before" in details
    running = await update(stub, rid, RUNNING, attempt_id="a2", expected_version=requeued.status.version)
    assert [a.attempt_id for a in running.status.attempts] == ["a1", "a2"]
    assert running.status.attempts[1].number == 2 and not running.status.HasField("retry_time")
    late = await append(stub, reward(rid, 0.5, attempt_id="a1"))
    assert list(late.attempt_ids) == ["a1"]
    await append(stub, model_request(rid, [1, 2], [4], [-0.2]), reward(rid, 1.0))

    done = await update(stub, rid, SUCCEEDED, ending_attempt_id="a2")
    assert done.status.state == SUCCEEDED and done.status.attempts[1].state == SUCCEEDED

    [entry] = await terminal_entries(stub, rid)
    assert entry.rollout.status.attempt_id == "a2"
    assert [e.attempt_id for e in entry.events] == ["a2", "a2"]
    assert [e.reward.value for e in entry.events if e.event_type == "reward"] == [1.0]
    assert {e.attempt_id for e in await list_events(stub, rid)} == {"a2"}
    assert [e.reward.value for e in await list_events(stub, rid, attempt_id="a1", event_type="reward")] == [0.0, 0.5]
    assert len(await list_events(stub, rid, attempt_id="*")) == 5


async def test_exhausted_attempts_fail_once_with_every_attempts_reason(stub, uid: str) -> None:
    rid = f"{uid}-r"
    await create_with(stub, rid, R.RetryPolicy(max_attempts=2))
    await update(stub, rid, RUNNING, attempt_id="a1")
    again = await update(stub, rid, FAILED, failure_reason=LOST, error_message="pid 7 vanished")
    assert again.status.state == QUEUING
    await update(stub, rid, RUNNING, attempt_id="a2")
    final = await update(stub, rid, FAILED, failure_reason=KILLED, error_message="agent killed by SIGKILL")
    assert final.status.state == FAILED and final.status.failure_reason == KILLED
    assert [(a.failure_reason, a.error_message) for a in final.status.attempts] == [
        (LOST, "pid 7 vanished"),
        (KILLED, "agent killed by SIGKILL"),
    ]
    [entry] = await terminal_entries(stub, rid)
    assert entry.rollout.status.state == FAILED


async def test_the_agents_own_exit_code_is_an_answer_unless_the_policy_lists_it(stub, uid: str) -> None:
    plain, listed, none = f"{uid}-plain", f"{uid}-listed", f"{uid}-none"
    await create_with(stub, plain, R.RetryPolicy(max_attempts=3))
    await create_with(stub, listed, R.RetryPolicy(max_attempts=3, retry_on=[EXIT_CODE]))
    await create_with(stub, none, None)
    for rid in (plain, listed, none):
        await update(stub, rid, RUNNING, attempt_id="a1")
    assert (await update(stub, plain, FAILED, failure_reason=EXIT_CODE)).status.state == FAILED
    assert (await update(stub, listed, FAILED, failure_reason=EXIT_CODE)).status.state == QUEUING
    # Without a policy nothing is retried, not even an infrastructure fault.
    assert (await update(stub, none, FAILED, failure_reason=KILLED)).status.state == FAILED


async def test_a_report_for_a_superseded_attempt_cannot_end_the_next_one(stub, uid: str) -> None:
    rid = f"{uid}-r"
    await create_with(stub, rid, R.RetryPolicy(max_attempts=3))
    await update(stub, rid, RUNNING, attempt_id="a1")
    await update(stub, rid, FAILED, failure_reason=LOST, ending_attempt_id="a1")
    # The same report again (a retry after a lost answer) finds no running attempt a1.
    details = await expect_error(
        grpc.StatusCode.FAILED_PRECONDITION, update(stub, rid, FAILED, failure_reason=LOST, ending_attempt_id="a1")
    )
    assert "a1" in details
    await update(stub, rid, RUNNING, attempt_id="a2")
    await expect_error(grpc.StatusCode.FAILED_PRECONDITION, update(stub, rid, SUCCEEDED, ending_attempt_id="a1"))
    current = (await stub.GetRollout(pb.GetRolloutRequest(rollout_id=rid))).rollout
    assert current.status.state == RUNNING and current.status.attempt_id == "a2"
    # Events for an attempt the rollout never had are still refused.
    details = await expect_error(grpc.StatusCode.NOT_FOUND, append(stub, reward(rid, 1.0, attempt_id="a3")))
    assert "a3" in details


@pytest.mark.parametrize(
    ("policy", "field"),
    [
        (R.RetryPolicy(max_attempts=101), "max_attempts"),
        (R.RetryPolicy(max_attempts=-1), "max_attempts"),
        (R.RetryPolicy(initial_backoff_seconds=-1), "initial_backoff_seconds"),
        (R.RetryPolicy(max_backoff_seconds=float("inf")), "max_backoff_seconds"),
        (R.RetryPolicy(retry_on=[R.FAILURE_REASON_INVALID_CONFIG]), "retry_on"),
        (R.RetryPolicy(retry_on=[77]), "retry_on"),
    ],
)
async def test_an_unusable_retry_policy_is_refused_naming_the_field(stub, uid: str, policy, field: str) -> None:
    details = await expect_error(grpc.StatusCode.INVALID_ARGUMENT, create_with(stub, f"{uid}-r", policy))
    assert f"config.retry.{field}" in details


async def test_failure_reason_goes_with_failed_only(stub, uid: str) -> None:
    rid = f"{uid}-r"
    await create_with(stub, rid, None)
    await update(stub, rid, RUNNING, attempt_id="a1")
    details = await expect_error(grpc.StatusCode.INVALID_ARGUMENT, update(stub, rid, SUCCEEDED, failure_reason=LOST))
    assert "failure_reason" in details


async def test_attempts_survive_a_restart_and_late_events_of_earlier_attempts_are_still_accepted(tmp_path) -> None:
    store = f"sqlite:{tmp_path / 'ledger.db'}"
    with start_ledger(store=store, log_dir=tmp_path) as led:
        async with grpc.aio.insecure_channel(led.address) as channel:
            stub = ledger_service_pb2_grpc.LedgerServiceStub(channel)
            await create_with(stub, "r", R.RetryPolicy(max_attempts=2))
            await update(stub, "r", RUNNING, attempt_id="a1")
            await update(stub, "r", FAILED, failure_reason=R.FAILURE_REASON_LAUNCHER_DIED)
            await update(stub, "r", RUNNING, attempt_id="a2")
    with start_ledger(store=store, log_dir=tmp_path) as led:
        async with grpc.aio.insecure_channel(led.address) as channel:
            stub = ledger_service_pb2_grpc.LedgerServiceStub(channel)
            reply = await append(stub, reward("r", 0.0, attempt_id="a1"), reward("r", 1.0, attempt_id="a2"))
            assert list(reply.attempt_ids) == ["a1", "a2"]
            await expect_error(grpc.StatusCode.NOT_FOUND, append(stub, reward("r", 1.0, attempt_id="zz")))
            await expect_error(grpc.StatusCode.FAILED_PRECONDITION, update(stub, "r", RUNNING, attempt_id="a1"))
            final = await update(stub, "r", FAILED, failure_reason=KILLED)
            assert final.status.state == FAILED  # two attempts were the most
            assert [a.attempt_id for a in final.status.attempts] == ["a1", "a2"]


async def test_events_filed_before_any_claim_reach_the_trainer_with_the_attempt_that_ran(stub, uid: str) -> None:
    """Issue 27: a reward posted with v1.0's attempt "0" before any controller claimed the rollout is filed under
    no attempt; the terminal feed gave the trainer the final attempt's events only, so that reward was invisible."""
    rid = f"{uid}-early"
    await create_with(stub, rid, None)
    await append(stub, reward(rid, 0.75), custom(rid, '{"hook": 1}'))  # filed under no attempt (queuing)
    await update(stub, rid, RUNNING, attempt_id="a1", launcher_ref="pid:1")
    await append(stub, model_request(rid, [1, 2], [3], [-0.1], attempt_id="a1"))
    await update(stub, rid, SUCCEEDED)
    [entry] = await terminal_entries(stub, rid)
    events = list(entry.events)
    assert [(e.event_type, e.attempt_id) for e in events] == [("reward", ""), ("model_request", "a1")]
    assert events[0].reward.value == 0.75

    # The attempt's own reward, posted later, comes later: the trainer's last-reward rule takes it.
    rid = f"{uid}-both"
    await create_with(stub, rid, None)
    await append(stub, reward(rid, 0.75))
    await update(stub, rid, RUNNING, attempt_id="a1", launcher_ref="pid:1")
    await append(stub, model_request(rid, [1, 2], [3], [-0.1], attempt_id="a1"), reward(rid, 0.25, attempt_id="a1"))
    await update(stub, rid, SUCCEEDED)
    [entry] = await terminal_entries(stub, rid)
    rewards = [e.reward.value for e in entry.events if e.event_type == "reward"]
    assert rewards == [0.75, 0.25]
