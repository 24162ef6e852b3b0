"""Run metrics on SQLite: acknowledged reports survive kill -9, and a watcher sees every step once across a restart."""

from __future__ import annotations

import asyncio
import contextlib

from services._gen.agl.v1 import ledger_service_pb2 as pb
from services._gen.agl.v1 import run_pb2
from services.client import LedgerClient, RetryPolicy
from tests.support.procs import free_port, start_ledger


async def test_run_metrics_survive_kill_9_and_stream_without_loss_or_duplicates(tmp_path):
    store = f"sqlite:{tmp_path / 'ledger.db'}"
    port = free_port()
    address = f"127.0.0.1:{port}"
    steps_seen: list[int] = []
    synced = asyncio.Event()

    async with LedgerClient(address, retry=RetryPolicy()) as watcher_client:

        async def watch() -> None:
            async for message in watcher_client.watch_runs(run_id="run-d", include_steps=True):
                if message.type == pb.RUN_CHANGE_TYPE_SYNCED:
                    synced.set()
                elif message.type in (pb.RUN_CHANGE_TYPE_STEP, pb.RUN_CHANGE_TYPE_SNAPSHOT) and message.HasField(
                    "step"
                ):
                    steps_seen.append(message.step.step)

        with start_ledger(store=store, port=port, log_dir=tmp_path) as led:
            async with LedgerClient(address) as trainer:
                await trainer.create_run("run-d", {"model": "tiny"}, '{"lr": 0.5}')
                task = asyncio.create_task(watch())
                await asyncio.wait_for(synced.wait(), 10)
                for step in range(1, 6):
                    await trainer.report_run_steps("run-d", {step: {"agl/reward_mean": step / 10, "timing_s/gen": 1.5}})
                while len(steps_seen) < 5:
                    await asyncio.sleep(0.02)
            led.kill()  # SIGKILL: everything acknowledged above must be on disk

        with start_ledger(store=store, port=port, log_dir=tmp_path):
            async with LedgerClient(address) as trainer:
                run = await trainer.get_run("run-d")
                assert run.step_count == 5 and run.last_step == 5 and run.config_json == '{"lr": 0.5}'
                stored = await trainer.list_run_steps("run-d")
                assert [s.step for s in stored] == [1, 2, 3, 4, 5]
                assert stored[2].metrics["agl/reward_mean"] == 0.3 and stored[2].metrics["timing_s/gen"] == 1.5
                for step in range(6, 9):
                    await trainer.report_run_steps("run-d", {step: {"agl/reward_mean": step / 10}})
                await trainer.update_run_state("run-d", run_pb2.RUN_STATE_SUCCEEDED)
                deadline = asyncio.get_running_loop().time() + 20
                while len(steps_seen) < 8 and asyncio.get_running_loop().time() < deadline:
                    await asyncio.sleep(0.05)
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                # The watcher resumed from its last revision (kept across the restart): nothing lost, nothing twice.
                assert steps_seen == [1, 2, 3, 4, 5, 6, 7, 8]
                assert (await trainer.get_run("run-d")).state == run_pb2.RUN_STATE_SUCCEEDED
