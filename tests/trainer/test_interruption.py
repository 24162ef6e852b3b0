"""What an interrupted trainer tells the ledger (services/trainer/interruption.py), against the real ledger: the run
marked with the last step on record, and only a pause the run itself holds lifted."""

from __future__ import annotations

from pathlib import Path

from services._gen.agl.v1 import run_pb2
from services.client import LedgerClient
from services.trainer.interruption import record
from services.trainer.rollouts.datasets import last_checkpoint
from tests.support.procs import ServiceProcess


async def test_the_run_is_marked_and_only_its_own_pause_is_lifted(ledger: ServiceProcess, run_id: str) -> None:
    async with LedgerClient(ledger.address) as client:
        # Stopped before the run was on record: nothing to mark, and another's pause stays.
        await client.set_proxy_pause(True, reason="someone's update", owner="trainer:another", lease_seconds=60)
        assert await record(ledger.address, None, run_id, "SIGINT") == (-1, False)
        assert (await client.get_proxy_control()).paused

        await client.create_run(run_id)
        await client.report_run_steps(run_id, {1: {"training/global_step": 1.0}, 2: {"training/global_step": 2.0}})
        assert await record(ledger.address, None, run_id, "SIGTERM") == (2, False)
        assert (await client.get_proxy_control()).owner == "trainer:another"
        run = await client.get_run(run_id)
        assert run.state == run_pb2.RUN_STATE_FAILED and run.error_message == "interrupted by SIGTERM after step 2"

        # Its own pause (stopped mid-update) is lifted.
        await client.update_run_state(run_id, run_pb2.RUN_STATE_RUNNING)
        await client.set_proxy_pause(True, reason="step 3 weight update", owner=f"trainer:{run_id}", lease_seconds=60)
        assert await record(ledger.address, None, run_id, "SIGINT") == (2, True)
        assert not (await client.get_proxy_control()).paused
        assert (await client.get_run(run_id)).error_message == "interrupted by SIGINT after step 2"


def test_the_checkpoint_a_rerun_resumes_from(tmp_path: Path) -> None:
    assert last_checkpoint(tmp_path) == 0
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("7")
    assert last_checkpoint(tmp_path) == 7
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("")  # cut short
    assert last_checkpoint(tmp_path) == 0
