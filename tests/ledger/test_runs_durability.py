"""Run metrics: acknowledged reports survive kill -9 on SQLite, a watcher sees every step once across a restart, and
a watcher that stops reading is cut off (never the reporter held up) and resumes without loss."""

from __future__ import annotations

import asyncio
import contextlib

import grpc
import pytest

from services._gen.agl.v1 import ledger_service_pb2 as pb
from services._gen.agl.v1 import ledger_service_pb2_grpc, run_pb2
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


async def test_slow_run_watcher_is_cut_off_and_resumes_without_loss(tmp_path):
    total = 300
    metrics = {f"m/{i:03d}": float(i) for i in range(100)}  # ~2 KB per step: the slow reader's window fills
    with start_ledger(log_dir=tmp_path, extra_args=["--watch-buffer", "16"]) as led:
        async with (
            grpc.aio.insecure_channel(led.address, options=[("grpc.http2.bdp_probe", 0)]) as slow_channel,
            LedgerClient(led.address) as trainer,
        ):
            await trainer.create_run("run-slow")
            stub = ledger_service_pb2_grpc.LedgerServiceStub(slow_channel)
            slow = stub.WatchRuns(pb.WatchRunsRequest(run_id="run-slow", include_steps=True, after_revision=1))
            assert (await slow.read()).type == pb.RUN_CHANGE_TYPE_SYNCED
            for step in range(1, total + 1):  # the reporter is never held up by the watcher that reads nothing
                await asyncio.wait_for(trainer.report_run_steps("run-slow", {step: metrics}), 30)
            steps: list[int] = []
            last = 1
            with pytest.raises(grpc.aio.AioRpcError) as info:
                while True:
                    message = await asyncio.wait_for(slow.read(), 20)
                    assert message is not grpc.aio.EOF
                    last = message.revision
                    if message.type == pb.RUN_CHANGE_TYPE_STEP:
                        steps.append(message.step.step)
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert f"after_revision={last}" in (info.value.details() or "")
            assert len(steps) < total
            again = stub.WatchRuns(pb.WatchRunsRequest(run_id="run-slow", include_steps=True, after_revision=last))
            while (message := await asyncio.wait_for(again.read(), 20)).type != pb.RUN_CHANGE_TYPE_SYNCED:
                if message.type == pb.RUN_CHANGE_TYPE_STEP:
                    steps.append(message.step.step)
            again.cancel()
            assert steps == list(range(1, total + 1))
