"""Events through a real ledger (both stores): order, attempts, idempotency, atomic batches, triplet view."""

from __future__ import annotations

import math

import grpc
import pytest

from services._gen.agl.v1 import event_pb2
from services._gen.agl.v1 import ledger_service_pb2 as pb

from .support import (
    FAILED,
    RUNNING,
    SUCCEEDED,
    append,
    create,
    custom,
    expect_error,
    list_events,
    model_request,
    reward,
    update,
)

TRIPLET = event_pb2.EVENT_VIEW_TRIPLET


async def test_order_stamps_and_pass_through(stub, uid):
    rid = f"{uid}-r"
    await create(stub, rid)
    first = await append(stub, model_request(rid, [1, 2], [3], [-0.1]), custom(rid, '{"any": ["json", 1]}'))
    second = await append(stub, reward(rid, 0.5))
    assert list(first.sequences) == [1, 2] and list(second.sequences) == [3]
    events = await list_events(stub, rid)
    assert [e.sequence for e in events] == [1, 2, 3]
    assert [e.event_type for e in events] == ["model_request", "note", "reward"]
    assert all(e.create_time.seconds > 0 for e in events)
    assert events[1].data_json == '{"any": ["json", 1]}'
    assert events[0].model_request.request_json.startswith('{"messages"')
    assert events[2].reward.message == "well done"
    only_rewards = await list_events(stub, rid, event_type="reward")
    assert [e.sequence for e in only_rewards] == [3]


async def test_attempt_bucketing(stub, uid):
    rid = f"{uid}-r"
    await create(stub, rid)
    early = await append(stub, custom(rid, "{}"))  # before any claim: the current attempt is ""
    assert list(early.attempt_ids) == [""]
    await update(stub, rid, RUNNING, attempt_id="a0")
    await update(stub, rid, RUNNING, attempt_id="a1")
    reply = await append(stub, reward(rid, 1.0), custom(rid, "{}", attempt_id="a0"))  # a late event of a past attempt
    assert list(reply.attempt_ids) == ["a1", "a0"]
    await update(stub, rid, RUNNING, attempt_id="a2")
    await append(stub, reward(rid, 2.0))

    latest = await list_events(stub, rid)
    assert [(e.attempt_id, e.reward.value) for e in latest] == [("a2", 2.0)]
    a1 = await list_events(stub, rid, attempt_id="a1")
    assert [e.sequence for e in a1] == [2]
    everything = await list_events(stub, rid, attempt_id="*")
    assert [e.attempt_id for e in everything] == ["", "a1", "a0", "a2"]


async def test_event_id_makes_append_idempotent(stub, uid):
    rid = f"{uid}-r"
    await create(stub, rid)
    first = await append(stub, reward(rid, 1.0, event_id="e1"), reward(rid, 2.0, event_id="e2"))
    retry = await append(stub, reward(rid, 1.0, event_id="e1"), reward(rid, 3.0, event_id="e3"))
    assert list(first.sequences) == [1, 2]
    assert list(retry.sequences) == [1, 3]
    dup_in_batch = await append(stub, reward(rid, 4.0, event_id="e4"), reward(rid, 4.0, event_id="e4"))
    assert list(dup_in_batch.sequences) == [4, 4]
    assert [e.reward.value for e in await list_events(stub, rid)] == [1.0, 2.0, 3.0, 4.0]


async def test_batch_is_atomic(stub, uid):
    rid = f"{uid}-r"
    await create(stub, rid)
    details = await expect_error(
        grpc.StatusCode.NOT_FOUND, append(stub, reward(rid, 1.0), reward(f"{uid}-missing", 1.0))
    )
    assert f"{uid}-missing" in details
    details = await expect_error(
        grpc.StatusCode.INVALID_ARGUMENT,
        append(stub, reward(rid, 1.0), event_pb2.Event(rollout_id=rid, event_type="reward", reward=event_pb2.Reward())),
    )
    assert "reward.value" in details
    bad_json = model_request(rid, [1], [2])
    bad_json.model_request.response_json = "{truncated"
    details = await expect_error(grpc.StatusCode.INVALID_ARGUMENT, append(stub, reward(rid, 1.0), bad_json))
    assert "model_request.response_json" in details
    details = await expect_error(grpc.StatusCode.INVALID_ARGUMENT, append(stub, custom(rid, "nope")))
    assert "data_json" in details
    assert await list_events(stub, rid, attempt_id="*") == []
    # Nothing was consumed either: the next append gets sequence 1.
    assert list((await append(stub, reward(rid, 1.0))).sequences) == [1]


@pytest.mark.parametrize("end", [SUCCEEDED, FAILED])
async def test_a_finished_rollout_refuses_events_by_default(stub, uid, end):
    """Issue 17 #12: the events of a rollout the trainer may have read already do not change behind its back."""
    rid = f"{uid}-r"
    await create(stub, rid)
    await update(stub, rid, RUNNING, attempt_id="a")
    await append(stub, reward(rid, 1.0))
    await update(stub, rid, end)
    name = "succeeded" if end == SUCCEEDED else "failed"
    details = await expect_error(grpc.StatusCode.FAILED_PRECONDITION, append(stub, reward(rid, 0.0)))
    assert rid in details and name in details and "allow_terminal" in details
    # The deprecated reject_terminal keeps its meaning; a batch with one finished rollout stores nothing at all.
    other = f"{uid}-live"
    await create(stub, other)
    await update(stub, other, RUNNING, attempt_id="b")
    await expect_error(grpc.StatusCode.FAILED_PRECONDITION, append(stub, reward(rid, 0.0), reject_terminal=True))
    await expect_error(grpc.StatusCode.FAILED_PRECONDITION, append(stub, reward(other, 1.0), custom(rid, "{}")))
    assert await list_events(stub, other) == []
    assert [e.reward.value for e in await list_events(stub, rid)] == [1.0]


async def test_allow_terminal_stores_events_after_the_end(stub, uid):
    rid = f"{uid}-r"
    await create(stub, rid)
    await update(stub, rid, RUNNING, attempt_id="a")
    await update(stub, rid, SUCCEEDED)
    reply = await append(stub, custom(rid, '{"judge": "late"}', event_type="hook_note"), allow_terminal=True)
    assert list(reply.sequences) == [1] and list(reply.attempt_ids) == ["a"]
    stored = await list_events(stub, rid)
    assert [(e.event_type, e.data_json) for e in stored] == [("hook_note", '{"judge": "late"}')]
    details = await expect_error(
        grpc.StatusCode.INVALID_ARGUMENT, append(stub, reward(rid, 1.0), allow_terminal=True, reject_terminal=True)
    )
    assert "reject_terminal" in details and "allow_terminal" in details
    assert len(await list_events(stub, rid)) == 1


async def test_stream_append_refuses_a_finished_rollout_unless_allowed(stub, uid):
    rid = f"{uid}-r"
    await create(stub, rid)
    await update(stub, rid, RUNNING, attempt_id="a")
    await update(stub, rid, FAILED)
    call = stub.StreamAppendEvents()
    await call.write(pb.StreamAppendEventsRequest(request_id=1, append=pb.AppendEventsRequest(events=[reward(rid, 1)])))
    allowed = pb.AppendEventsRequest(events=[custom(rid, "{}")], allow_terminal=True)
    await call.write(pb.StreamAppendEventsRequest(request_id=2, append=allowed))
    await call.done_writing()
    replies = [reply async for reply in call]
    assert replies[0].request_id == 1 and replies[0].error_code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
    assert rid in replies[0].error_message and "failed" in replies[0].error_message
    assert replies[1].request_id == 2 and replies[1].error_code == 0 and list(replies[1].append.sequences) == [1]


async def test_triplet_view_trims_dedupes_and_nulls_bad_logprobs(stub, uid):
    rid = f"{uid}-r"
    await create(stub, rid)
    await update(stub, rid, RUNNING, attempt_id="a")
    await append(
        stub,
        model_request(rid, [1, 2, 3], [10, 11], [-0.5, -0.25]),  # superseded by the retry with the same prompt
        custom(rid, '{"tool": "calc"}'),  # left out of the triplet view
        model_request(rid, [1, 2, 3], [12, 13], [-0.1, -0.2]),
        model_request(rid, [1, 2, 3, 12, 13, 4], [14], [-0.3, -0.4]),  # log-probs do not match the response
        model_request(rid, [5], [6], [math.nan]),  # not finite
        model_request(rid, [7], [8]),  # none returned
        reward(rid, 0.75),
    )
    view = await list_events(stub, rid, view=TRIPLET)
    assert [e.sequence for e in view] == [3, 4, 5, 6, 7]
    calls = [e.model_request for e in view[:4]]
    assert list(calls[0].response_token_ids) == [12, 13] and list(calls[0].response_logprobs) == [-0.1, -0.2]
    assert calls[0].has_response_logprobs and calls[0].model == "m" and calls[0].model_version == 3
    assert calls[0].status == event_pb2.MODEL_REQUEST_STATUS_OK
    assert calls[0].request_json == "" and calls[0].response_json == ""  # trimmed
    for call in calls[1:]:
        assert not call.has_response_logprobs and list(call.response_logprobs) == []
    assert list(calls[1].prompt_token_ids) == [1, 2, 3, 12, 13, 4]
    r = view[4].reward
    assert (r.value, r.source, r.reason, r.message) == (0.75, "judge", "exact", "")


async def test_list_events_pages(stub, uid):
    rid = f"{uid}-r"
    await create(stub, rid)
    await append(stub, *[reward(rid, float(i)) for i in range(25)])
    values: list[float] = []
    token = ""
    while True:
        reply = await stub.ListEvents(pb.ListEventsRequest(rollout_id=rid, page_size=10, page_token=token))
        values += [e.reward.value for e in reply.events]
        token = reply.next_page_token
        if not token:
            break
    assert values == [float(i) for i in range(25)]
    triplet_page = await stub.ListEvents(pb.ListEventsRequest(rollout_id=rid, view=TRIPLET, page_size=20))
    rest = await stub.ListEvents(
        pb.ListEventsRequest(rollout_id=rid, view=TRIPLET, page_size=20, page_token=triplet_page.next_page_token)
    )
    assert len(triplet_page.events) == 20 and len(rest.events) == 5 and rest.next_page_token == ""


async def test_malformed_request_bytes_are_invalid_argument(ledger_proc):
    async with grpc.aio.insecure_channel(ledger_proc.address) as channel:
        call = channel.unary_unary("/agl.v1.LedgerService/AppendEvents")
        details = await expect_error(grpc.StatusCode.INVALID_ARGUMENT, call(b"\x0a\xff\xff\xff\xff\x0f garbage"))
        assert "malformed" in details


async def test_stream_append_acknowledges_in_order_and_survives_bad_requests(stub, uid):
    rid = f"{uid}-r"
    await create(stub, rid)
    call = stub.StreamAppendEvents()
    requests = [
        pb.StreamAppendEventsRequest(
            request_id=1, append=pb.AppendEventsRequest(events=[reward(rid, 1.0, event_id="a")])
        ),
        pb.StreamAppendEventsRequest(request_id=2, append=pb.AppendEventsRequest(events=[reward(f"{uid}-no", 1.0)])),
        pb.StreamAppendEventsRequest(
            request_id=3, append=pb.AppendEventsRequest(events=[reward(rid, 2.0), reward(rid, 1.0, event_id="a")])
        ),
        pb.StreamAppendEventsRequest(request_id=4, append=pb.AppendEventsRequest(events=[custom(rid, "{bad")])),
        pb.StreamAppendEventsRequest(request_id=5, append=pb.AppendEventsRequest(events=[custom(rid, "{}")])),
    ]
    for request in requests:
        await call.write(request)  # pipelined: nothing awaited in between
    await call.done_writing()
    replies = [await call.read() for _ in requests]
    assert await call.read() is grpc.aio.EOF
    assert [r.request_id for r in replies] == [1, 2, 3, 4, 5]
    assert list(replies[0].append.sequences) == [1]
    assert replies[1].error_code == grpc.StatusCode.NOT_FOUND.value[0] and f"{uid}-no" in replies[1].error_message
    assert list(replies[2].append.sequences) == [2, 1]  # the duplicate event id returns the stored sequence
    assert (
        replies[3].error_code == grpc.StatusCode.INVALID_ARGUMENT.value[0] and "data_json" in replies[3].error_message
    )
    assert list(replies[4].append.sequences) == [3]
    assert [e.sequence for e in await list_events(stub, rid)] == [1, 2, 3]
    assert await call.code() == grpc.StatusCode.OK
