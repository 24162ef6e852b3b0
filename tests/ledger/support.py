"""Small helpers shared by the ledger tests (requests and events built the same way everywhere)."""

from __future__ import annotations

import grpc
import pytest

from services._gen.agl.v1 import event_pb2, ledger_service_pb2_grpc, rollout_pb2
from services._gen.agl.v1 import ledger_service_pb2 as pb

Stub = ledger_service_pb2_grpc.LedgerServiceStub
QUEUING = rollout_pb2.ROLLOUT_STATE_QUEUING
RUNNING = rollout_pb2.ROLLOUT_STATE_RUNNING
SUCCEEDED = rollout_pb2.ROLLOUT_STATE_SUCCEEDED
FAILED = rollout_pb2.ROLLOUT_STATE_FAILED


def spec(
    rollout_id: str, labels: dict[str, str] | None = None, input_json: str = '{"q": 1}'
) -> rollout_pb2.RolloutSpec:
    return rollout_pb2.RolloutSpec(
        rollout_id=rollout_id, input_json=input_json, metadata=rollout_pb2.RolloutMetadata(labels=labels or {})
    )


async def create(stub: Stub, *ids: str, labels: dict[str, str] | None = None) -> list[rollout_pb2.Rollout]:
    reply = await stub.CreateRollouts(pb.CreateRolloutsRequest(rollouts=[spec(i, labels) for i in ids]))
    return list(reply.rollouts)


async def update(stub: Stub, rollout_id: str, state: int, **fields: object) -> rollout_pb2.Rollout:
    reply = await stub.UpdateRolloutStatus(pb.UpdateRolloutStatusRequest(rollout_id=rollout_id, state=state, **fields))
    return reply.rollout


def model_request(
    rollout_id: str,
    prompt: list[int],
    response: list[int],
    logprobs: list[float] | None = None,
    *,
    event_id: str = "",
    attempt_id: str = "",
) -> event_pb2.Event:
    event = event_pb2.Event(rollout_id=rollout_id, attempt_id=attempt_id, event_type="model_request", event_id=event_id)
    mr = event.model_request
    mr.request_json = '{"messages": [{"role": "user", "content": "hi"}]}'
    mr.response_json = '{"choices": [{"message": {"role": "assistant", "content": "yo"}}]}'
    mr.prompt_token_ids.extend(prompt)
    mr.response_token_ids.extend(response)
    if logprobs is not None:
        mr.response_logprobs.extend(logprobs)
        mr.has_response_logprobs = True
    mr.model = "m"
    mr.model_version = 3
    mr.status = event_pb2.MODEL_REQUEST_STATUS_OK
    return event


def reward(rollout_id: str, value: float, *, attempt_id: str = "", event_id: str = "") -> event_pb2.Event:
    return event_pb2.Event(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        event_id=event_id,
        event_type="reward",
        reward=event_pb2.Reward(value=value, message="well done", source="judge", reason="exact"),
    )


def custom(rollout_id: str, data_json: str, *, event_type: str = "note", attempt_id: str = "") -> event_pb2.Event:
    return event_pb2.Event(rollout_id=rollout_id, attempt_id=attempt_id, event_type=event_type, data_json=data_json)


async def append(
    stub: Stub, *events: event_pb2.Event, allow_terminal: bool = False, reject_terminal: bool = False
) -> pb.AppendEventsResponse:
    flags = {"allow_terminal": allow_terminal, "reject_terminal": reject_terminal}
    return await stub.AppendEvents(pb.AppendEventsRequest(events=list(events), **flags))


async def list_events(stub: Stub, rollout_id: str, **fields: object) -> list[event_pb2.Event]:
    reply = await stub.ListEvents(pb.ListEventsRequest(rollout_id=rollout_id, **fields))
    return list(reply.events)


async def expect_error(code: grpc.StatusCode, call: object) -> str:
    """Await `call`, expect it to fail with `code`, return the status details."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call  # type: ignore[misc]
    assert info.value.code() == code, info.value.details()
    return info.value.details() or ""
