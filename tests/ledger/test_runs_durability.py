"""Run metrics: acknowledged reports survive kill -9 on SQLite, a watcher sees every step once across a restart (and
across twenty, wherever the kill falls), and a watcher that stops reading is cut off (never the reporter held up)
and resumes without loss."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import grpc
import pytest

from services._gen.agl.v1 import ledger_service_pb2 as pb
from services._gen.agl.v1 import ledger_service_pb2_grpc, run_pb2
from services.client import LedgerClient, RetryPolicy
from tests.support.procs import ServiceProcess, free_port, start_ledger

STEP = pb.RUN_CHANGE_TYPE_STEP


async def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"not within {timeout_s} s: {what}"
        await asyncio.sleep(0.01)


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


async def test_a_run_watch_resumed_across_20_kill_9s_is_given_each_step_once(tmp_path):
    """Twenty rounds of a report, a kill -9 and a restart on the same file. Each kill leaves the watcher's last
    revision behind the ledger's, in turn: right after the report is acknowledged (the watcher may not have its
    steps yet), the moment the watcher is given the round's last step (the run's own change follows it), and after
    a change of another run, which this watcher's filter skips. A resume point the restart forgot would make the
    watcher start over and be given every step again, in a snapshot. Last, a report sent again, as a reporter does
    when a kill took the answer after the commit, is no change: nothing more is streamed."""
    rounds, per_round = 20, 2
    store = f"sqlite:{tmp_path / 'ledger.db'}"
    port = free_port()
    address = f"127.0.0.1:{port}"
    given: list[tuple[int, int]] = []  # (change type, step) of every step message, in order
    kill_when_given: dict[int, ServiceProcess] = {}
    synced, finished = asyncio.Event(), asyncio.Event()

    async with LedgerClient(address, retry=RetryPolicy()) as watcher_client:

        async def watch() -> None:
            async for message in watcher_client.watch_runs(run_id="run-k", include_steps=True):
                if message.type == pb.RUN_CHANGE_TYPE_SYNCED:
                    synced.set()
                elif message.HasField("step"):
                    given.append((message.type, message.step.step))
                    if (led := kill_when_given.pop(message.step.step, None)) is not None:
                        led.kill()
                elif message.run.state == run_pb2.RUN_STATE_SUCCEEDED:
                    finished.set()

        task: asyncio.Task[None] | None = None
        try:
            for round_ in range(rounds):
                numbers = range(round_ * per_round + 1, (round_ + 1) * per_round + 1)
                with start_ledger(store=store, port=port, log_dir=tmp_path) as led:
                    async with LedgerClient(address) as trainer:
                        if task is None:
                            await trainer.create_run("run-k", {"model": "tiny"})
                            task = asyncio.create_task(watch())
                            await asyncio.wait_for(synced.wait(), 10)
                        if round_ % 3 == 1:
                            kill_when_given[numbers[-1]] = led
                        await trainer.report_run_steps("run-k", {n: {"agl/reward_mean": n / 100} for n in numbers})
                        if round_ % 3 == 1:
                            await wait_until(lambda: not led.alive(), f"the watcher given step {numbers[-1]}")
                        elif round_ % 3 == 2:
                            await wait_until(lambda n=numbers[-1]: len(given) >= n, f"the watcher given {numbers[-1]}")
                            await trainer.create_run(f"other-{round_}")
                    led.kill()
            with start_ledger(store=store, port=port, log_dir=tmp_path):
                async with LedgerClient(address) as trainer:
                    last, before = rounds * per_round, await trainer.get_run("run-k")
                    again, run = await trainer.report_run_steps("run-k", {last: {"agl/reward_mean": last / 100}})
                    assert run == before and again[0].revision < before.revision  # no new revision, no write
                    await trainer.update_run_state("run-k", run_pb2.RUN_STATE_SUCCEEDED)
                    await asyncio.wait_for(finished.wait(), 30)  # changes come in revision order: steps first
                    stored = await trainer.list_run_steps("run-k")
        finally:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
    assert [s.step for s in stored] == list(range(1, rounds * per_round + 1))
    assert given == [(STEP, n) for n in range(1, rounds * per_round + 1)]


async def test_a_resume_from_before_a_deletion_starts_over_after_a_restart(tmp_path):
    """A deleted run leaves nothing in the store to replay, so a resume from before the deletion is refused (the
    client then starts over from a snapshot) and a resume from after it is not."""
    store = f"sqlite:{tmp_path / 'ledger.db'}"
    port = free_port()
    with start_ledger(store=store, port=port, log_dir=tmp_path) as led:
        async with LedgerClient(led.address) as client:
            await client.create_run("run-kept")
            before = (await client.create_run("run-gone"))[0].revision
            await client.report_run_steps("run-kept", {1: {"agl/reward_mean": 0.5}})
            assert await client.delete_runs(["run-gone"]) == 1
            after = (await client.report_run_steps("run-kept", {2: {"agl/reward_mean": 0.6}}))[1].revision
        led.kill()
    with start_ledger(store=store, port=port, log_dir=tmp_path) as led:
        async with grpc.aio.insecure_channel(led.address) as channel:
            stub = ledger_service_pb2_grpc.LedgerServiceStub(channel)
            refused = stub.WatchRuns(pb.WatchRunsRequest(include_steps=True, after_revision=before))
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await refused.read()
            assert info.value.code() == grpc.StatusCode.OUT_OF_RANGE
            resumed = stub.WatchRuns(pb.WatchRunsRequest(include_steps=True, after_revision=after - 2))
            replay = [await resumed.read() for _ in range(3)]
            resumed.cancel()
            assert [(m.type, m.revision) for m in replay] == [
                (STEP, after - 1),
                (pb.RUN_CHANGE_TYPE_RUN, after),
                (pb.RUN_CHANGE_TYPE_SYNCED, after),
            ]
            assert replay[0].step.step == 2 and replay[1].run.step_count == 2


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
