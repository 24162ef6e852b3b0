"""services.trainer.run.progress, the trainer's side of training progress, against the real ledger."""

from __future__ import annotations

import json

import numpy as np

from services._gen.agl.v1 import run_pb2
from services.client import LedgerClient
from services.trainer.run import progress


async def test_start_report_finish_and_reopen(ledger_proc, uid):
    run_id = f"run-{uid}"
    async with LedgerClient(ledger_proc.address) as client:
        run = await progress.start_run(client, run_id, {"model": "tiny"}, {"algorithm": "grpo", "n": 4})
        assert run.state == run_pb2.RUN_STATE_RUNNING
        assert json.loads(run.config_json) == {"algorithm": "grpo", "n": 4}
        metrics = {
            "agl/rollout/succeeded": 8,
            "val/agl/reward_mean": np.float32(0.25),
            "timing_s/gen": 1.5,
            "critic/score/mean": float("nan"),
            "actor/entropy": np.array(0.5),
            "response_length/mean": float("inf"),
            "note": "text",
            "histogram": [1, 2, 3],
            "done": True,
        }
        kept = await progress.report_step(client, run_id, 1, metrics)
        assert kept == 5
        [step] = await client.list_run_steps(run_id)
        assert dict(step.metrics) == {
            "agl/rollout/succeeded": 8.0,
            "val/agl/reward_mean": 0.25,
            "timing_s/gen": 1.5,
            "actor/entropy": 0.5,
            "done": 1.0,
        }
        ended = await progress.finish_run(client, run_id, error="trainer crashed: OOM")
        assert ended.state == run_pb2.RUN_STATE_FAILED and ended.error_message == "trainer crashed: OOM"
        # A resumed trainer starting the same run reopens it and keeps its steps.
        again = await progress.start_run(client, run_id, {"model": "tiny"}, {"algorithm": "grpo", "n": 4})
        assert again.state == run_pb2.RUN_STATE_RUNNING and again.step_count == 1 and not again.error_message
        assert (await progress.finish_run(client, run_id)).state == run_pb2.RUN_STATE_SUCCEEDED
