"""`agl train`'s collected records (the smoke rollout, `agl try`, `agl eval`) from a real ledger's terminal stream."""

from __future__ import annotations

from services._gen.agl.v1 import event_pb2, rollout_pb2
from services.cli.train.collect import consume_terminal
from services.client import LedgerClient
from tests.support.procs import ServiceProcess

from .conftest import KEY


def _call(rollout_id: str, prompt: list[int], response: list[int]) -> event_pb2.Event:
    request = event_pb2.ModelRequest(
        prompt_token_ids=prompt,
        response_token_ids=response,
        response_logprobs=[-0.5] * len(response),
        has_response_logprobs=True,
        status=event_pb2.MODEL_REQUEST_STATUS_OK,
        http_status=200,
    )
    return event_pb2.Event(rollout_id=rollout_id, event_type="model_request", model_request=request)


async def test_a_record_holds_the_last_call_per_prompt_as_training_would(ledger: ServiceProcess, uid: str) -> None:
    client = LedgerClient(ledger.address, KEY)
    rollout_id = f"{uid}-r"
    labels = {"collect-test": uid}
    spec = rollout_pb2.RolloutSpec(rollout_id=rollout_id, input_json="{}")
    spec.metadata.labels.update(labels)
    try:
        await client.create_rollouts([spec])
        await client.update_status(rollout_id, rollout_pb2.ROLLOUT_STATE_RUNNING, attempt_id="a1")
        await client.append_events(
            [
                _call(rollout_id, [1, 2], [3]),
                _call(rollout_id, [1, 2], [4]),  # a retry: the record keeps it, not the first
                _call(rollout_id, [1, 2, 4, 5], [6]),
                event_pb2.Event(rollout_id=rollout_id, event_type="reward", reward=event_pb2.Reward(value=0.5)),
            ]
        )
        await client.update_status(rollout_id, rollout_pb2.ROLLOUT_STATE_SUCCEEDED)
        (record,) = await consume_terminal(client, labels, 1)
    finally:
        await client.close()
    assert [(c["prompt_token_ids"], c["response_token_ids"]) for c in record["calls"]] == [
        ([1, 2], [4]),
        ([1, 2, 4, 5], [6]),
    ]
    assert record["calls"][0]["response_logprobs"] == [-0.5] and record["reward"] == 0.5
