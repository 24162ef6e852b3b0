"""A test driver that plays controller + agent against the real ledger: it finishes rollouts by hand."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from services._gen.agl.v1 import event_pb2, rollout_pb2
from services.client import LedgerClient
from services.trainer.rollouts.specs import LABEL_RUN

RUNNING = rollout_pb2.ROLLOUT_STATE_RUNNING
SUCCEEDED = rollout_pb2.ROLLOUT_STATE_SUCCEEDED
FAILED = rollout_pb2.ROLLOUT_STATE_FAILED


async def wait_rollouts(client: LedgerClient, run_id: str, count: int, timeout_s: float = 20.0) -> list[str]:
    """Ids (sorted) of the run's rollouts once at least `count` exist."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        found = await client.list_rollouts(labels={LABEL_RUN: run_id})
        if len(found) >= count:
            return sorted(r.rollout_id for r in found)
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"{len(found)} of {count} rollouts of {run_id} exist")
        await asyncio.sleep(0.02)


async def finish(
    client: LedgerClient,
    rollout_id: str,
    *,
    reward: float | None = 1.0,
    ok: bool = True,
    calls: Sequence[tuple[list[int], list[int]]] = (([1, 2], [3, 4]),),
) -> None:
    """queuing -> running, the calls and the reward as events, then succeeded or failed."""
    await client.update_status(rollout_id, RUNNING, attempt_id="a1", controller_id="test-driver")
    events = []
    for prompt, response in calls:
        request = event_pb2.ModelRequest(
            prompt_token_ids=prompt,
            response_token_ids=response,
            response_logprobs=[-0.5] * len(response),
            has_response_logprobs=True,
            status=event_pb2.MODEL_REQUEST_STATUS_OK,
        )
        events.append(event_pb2.Event(rollout_id=rollout_id, event_type="model_request", model_request=request))
    if reward is not None:
        events.append(
            event_pb2.Event(rollout_id=rollout_id, event_type="reward", reward=event_pb2.Reward(value=reward))
        )
    if events:
        await client.append_events(events)
    await client.update_status(rollout_id, SUCCEEDED if ok else FAILED, error_message="" if ok else "exit code 1")
