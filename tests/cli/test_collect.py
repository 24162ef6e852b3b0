"""`agl train`'s collected records (the smoke rollout, `agl try`, `agl eval`) from a real ledger's terminal stream."""

from __future__ import annotations

from services._gen.agl.v1 import rollout_pb2
from services.cli.train.collect import consume_terminal
from services.client import LedgerClient
from tests.support.procs import ServiceProcess
from tests.trainer.driver import finish

from .conftest import KEY


async def test_a_record_holds_the_last_call_per_prompt_as_training_would(ledger: ServiceProcess, uid: str) -> None:
    client = LedgerClient(ledger.address, KEY)
    rollout_id = f"{uid}-r"
    labels = {"collect-test": uid}
    spec = rollout_pb2.RolloutSpec(rollout_id=rollout_id, input_json="{}")
    spec.metadata.labels.update(labels)
    try:
        await client.create_rollouts([spec])
        # A retry of [1, 2]: the record keeps it, not the first.
        await finish(client, rollout_id, reward=0.5, calls=[([1, 2], [3]), ([1, 2], [4]), ([1, 2, 4, 5], [6])])
        (record,) = await consume_terminal(client, labels, 1)
    finally:
        await client.close()
    assert [(c["prompt_token_ids"], c["response_token_ids"]) for c in record["calls"]] == [
        ([1, 2], [4]),
        ([1, 2, 4, 5], [6]),
    ]
    assert record["calls"][0]["response_logprobs"] == [-0.5] and record["reward"] == 0.5
