"""Runs and step metrics over gRPC against the real ledger (memory and SQLite): create, report, list, watch."""

from __future__ import annotations

import asyncio
import contextlib

import grpc

from services._gen.agl.v1 import ledger_service_pb2 as pb
from services._gen.agl.v1 import run_pb2
from services.client import LedgerClient

from .support import expect_error

RUNNING = run_pb2.RUN_STATE_RUNNING
SUCCEEDED = run_pb2.RUN_STATE_SUCCEEDED
FAILED = run_pb2.RUN_STATE_FAILED


def steps(**by_step: dict[str, float]) -> list[run_pb2.RunStep]:
    return [run_pb2.RunStep(step=int(k.removeprefix("s")), metrics=v) for k, v in by_step.items()]


async def test_create_is_idempotent_and_get_returns_the_run(stub, uid):
    run_id = f"run-{uid}"
    first = await stub.CreateRun(
        pb.CreateRunRequest(run_id=run_id, labels={"model": "tiny"}, config_json='{"lr": 1e-6}')
    )
    assert first.created and first.run.state == RUNNING and first.run.labels["model"] == "tiny"
    again = await stub.CreateRun(pb.CreateRunRequest(run_id=run_id, labels={"model": "other"}))
    assert not again.created
    assert again.run == first.run  # returned unchanged
    got = await stub.GetRun(pb.GetRunRequest(run_id=run_id))
    assert got.run == first.run
    assert got.run.create_time.seconds > 0


async def test_bad_run_requests_name_the_problem(stub, uid):
    details = await expect_error(grpc.StatusCode.NOT_FOUND, stub.GetRun(pb.GetRunRequest(run_id=f"nope-{uid}")))
    assert f"nope-{uid}" in details
    details = await expect_error(grpc.StatusCode.INVALID_ARGUMENT, stub.CreateRun(pb.CreateRunRequest(run_id="a/b")))
    assert "run_id" in details
    await expect_error(grpc.StatusCode.INVALID_ARGUMENT, stub.CreateRun(pb.CreateRunRequest(run_id="")))
    details = await expect_error(
        grpc.StatusCode.INVALID_ARGUMENT, stub.CreateRun(pb.CreateRunRequest(run_id=f"r-{uid}", config_json="{"))
    )
    assert "config_json" in details
    await stub.CreateRun(pb.CreateRunRequest(run_id=f"r-{uid}"))
    nan = pb.ReportRunStepsRequest(run_id=f"r-{uid}", steps=steps(s1={"ok": 1.0, "val/agl/reward_mean": float("nan")}))
    details = await expect_error(grpc.StatusCode.INVALID_ARGUMENT, stub.ReportRunSteps(nan))
    assert "val/agl/reward_mean" in details
    negative = pb.ReportRunStepsRequest(run_id=f"r-{uid}", steps=steps(s1={"x": 1.0}))
    negative.steps[0].step = -1
    details = await expect_error(grpc.StatusCode.INVALID_ARGUMENT, stub.ReportRunSteps(negative))
    assert "negative" in details
    # Nothing of a refused report was stored.
    listed = await stub.ListRunSteps(pb.ListRunStepsRequest(run_id=f"r-{uid}"))
    assert list(listed.steps) == []
    unknown = pb.ReportRunStepsRequest(run_id=f"gone-{uid}", steps=steps(s1={"x": 1.0}))
    assert f"gone-{uid}" in await expect_error(grpc.StatusCode.NOT_FOUND, stub.ReportRunSteps(unknown))
    bad_state = pb.UpdateRunStateRequest(run_id=f"r-{uid}", state=run_pb2.RUN_STATE_UNSPECIFIED)
    assert "state" in await expect_error(grpc.StatusCode.INVALID_ARGUMENT, stub.UpdateRunState(bad_state))


async def test_steps_merge_and_page_in_step_order(stub, uid):
    run_id = f"run-{uid}"
    await stub.CreateRun(pb.CreateRunRequest(run_id=run_id))
    await stub.ReportRunSteps(
        pb.ReportRunStepsRequest(run_id=run_id, steps=steps(s2={"a": 2.0}, s0={"a": 0.0}, s1={"a": 1.0}))
    )
    reply = await stub.ReportRunSteps(
        pb.ReportRunStepsRequest(run_id=run_id, steps=steps(s1={"val/agl/reward_mean": 0.5, "a": 1.5}))
    )
    assert dict(reply.steps[0].metrics) == {"a": 1.5, "val/agl/reward_mean": 0.5}
    assert reply.run.last_step == 2 and reply.run.step_count == 3
    page = await stub.ListRunSteps(pb.ListRunStepsRequest(run_id=run_id, page_size=2))
    assert [s.step for s in page.steps] == [0, 1] and page.next_page_token
    rest = await stub.ListRunSteps(pb.ListRunStepsRequest(run_id=run_id, page_size=2, page_token=page.next_page_token))
    assert [s.step for s in rest.steps] == [2] and not rest.next_page_token
    only = await stub.ListRunSteps(pb.ListRunStepsRequest(run_id=run_id, metric_names=["val/agl/reward_mean"]))
    assert [dict(s.metrics) for s in only.steps] == [{}, {"val/agl/reward_mean": 0.5}, {}]
    after = await stub.ListRunSteps(pb.ListRunStepsRequest(run_id=run_id, after_step=1))
    assert [s.step for s in after.steps] == [2]


async def test_list_runs_pages_filters_and_delete_removes_steps(stub, uid):
    for i in range(5):
        await stub.CreateRun(pb.CreateRunRequest(run_id=f"run-{uid}-{i}", labels={"t": uid, "odd": str(i % 2)}))
    await stub.ReportRunSteps(pb.ReportRunStepsRequest(run_id=f"run-{uid}-0", steps=steps(s1={"x": 1.0})))
    seen: list[str] = []
    token = ""
    while True:
        page = await stub.ListRuns(pb.ListRunsRequest(label_selector={"t": uid}, page_size=2, page_token=token))
        assert len(page.runs) <= 2
        seen += [r.run_id for r in page.runs]
        token = page.next_page_token
        if not token:
            break
    assert seen == [f"run-{uid}-{i}" for i in range(5)]
    odd = await stub.ListRuns(pb.ListRunsRequest(label_selector={"t": uid, "odd": "1"}))
    assert [r.run_id for r in odd.runs] == [f"run-{uid}-1", f"run-{uid}-3"]
    await stub.UpdateRunState(pb.UpdateRunStateRequest(run_id=f"run-{uid}-2", state=FAILED, error_message="oom"))
    failed = await stub.ListRuns(pb.ListRunsRequest(label_selector={"t": uid}, states=[FAILED]))
    assert [(r.run_id, r.error_message) for r in failed.runs] == [(f"run-{uid}-2", "oom")]
    assert failed.runs[0].end_time.seconds > 0
    reply = await stub.DeleteRuns(pb.DeleteRunsRequest(run_ids=[f"run-{uid}-0", f"run-{uid}-0", f"never-{uid}"]))
    assert reply.deleted_count == 1
    await expect_error(grpc.StatusCode.NOT_FOUND, stub.ListRunSteps(pb.ListRunStepsRequest(run_id=f"run-{uid}-0")))
    # A run created again under the same id starts without the old steps.
    await stub.CreateRun(pb.CreateRunRequest(run_id=f"run-{uid}-0"))
    listed = await stub.ListRunSteps(pb.ListRunStepsRequest(run_id=f"run-{uid}-0"))
    assert list(listed.steps) == []


async def test_watch_sends_snapshot_then_steps_and_resumes_without_loss_or_duplicates(ledger_proc, uid):
    run_id = f"run-{uid}"
    async with LedgerClient(ledger_proc.address) as client:
        await client.create_run(run_id, {"w": uid})
        await client.report_run_steps(run_id, {1: {"r": 0.1}})
        got: asyncio.Queue[pb.WatchRunsResponse] = asyncio.Queue()

        async def watch(after: int) -> None:
            async for message in client.watch_runs(run_id=run_id, include_steps=True, after_revision=after):
                got.put_nowait(message)

        task = asyncio.create_task(watch(0))
        first = [await asyncio.wait_for(got.get(), 10) for _ in range(3)]
        assert [m.type for m in first] == [
            pb.RUN_CHANGE_TYPE_SNAPSHOT,
            pb.RUN_CHANGE_TYPE_SNAPSHOT,
            pb.RUN_CHANGE_TYPE_SYNCED,
        ]
        assert first[0].run.run_id == run_id and first[1].step.step == 1
        await client.report_run_steps(run_id, {2: {"r": 0.2}})
        live = [await asyncio.wait_for(got.get(), 10) for _ in range(2)]
        assert [m.type for m in live] == [pb.RUN_CHANGE_TYPE_STEP, pb.RUN_CHANGE_TYPE_RUN]
        assert live[0].step.step == 2 and live[0].step.metrics["r"] == 0.2 and live[1].run.last_step == 2
        resume_from = live[0].revision  # as if the consumer had handled only the step
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        # Changes while nobody watches, then a resumed watch: exactly the missed changes, in order.
        await client.report_run_steps(run_id, {3: {"r": 0.3}})
        await client.update_run_state(run_id, SUCCEEDED)
        task = asyncio.create_task(watch(resume_from))
        replay = [await asyncio.wait_for(got.get(), 10) for _ in range(5)]
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        kinds = [m.type for m in replay]
        assert kinds == [
            pb.RUN_CHANGE_TYPE_RUN,
            pb.RUN_CHANGE_TYPE_STEP,
            pb.RUN_CHANGE_TYPE_RUN,
            pb.RUN_CHANGE_TYPE_RUN,
            pb.RUN_CHANGE_TYPE_SYNCED,
        ]
        assert replay[1].step.step == 3 and replay[3].run.state == SUCCEEDED
        revisions = [m.revision for m in replay[:4]]
        assert revisions == sorted(revisions) and revisions[0] == resume_from + 1
        assert got.empty()


async def test_watch_without_steps_filters_by_label_and_sees_deletes(ledger_proc, uid):
    async with LedgerClient(ledger_proc.address) as client:
        got: asyncio.Queue[pb.WatchRunsResponse] = asyncio.Queue()

        async def watch() -> None:
            async for message in client.watch_runs(labels={"w": uid}):
                got.put_nowait(message)

        task = asyncio.create_task(watch())
        synced = await asyncio.wait_for(got.get(), 10)
        assert synced.type == pb.RUN_CHANGE_TYPE_SYNCED
        await client.create_run(f"other-{uid}", {"w": "someone-else"})
        await client.create_run(f"run-{uid}", {"w": uid})
        await client.report_run_steps(f"run-{uid}", {5: {"r": 1.0}})
        await client.delete_runs([f"run-{uid}"])
        messages = [await asyncio.wait_for(got.get(), 10) for _ in range(3)]
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert [m.type for m in messages] == [pb.RUN_CHANGE_TYPE_RUN, pb.RUN_CHANGE_TYPE_RUN, pb.RUN_CHANGE_TYPE_DELETE]
        assert all(m.run.run_id == f"run-{uid}" for m in messages)
        assert messages[1].run.last_step == 5 and not messages[2].HasField("step")


async def test_resume_from_a_revision_ahead_is_out_of_range(stub, uid):
    call = stub.WatchRuns(pb.WatchRunsRequest(after_revision=10**12))
    details = await expect_error(grpc.StatusCode.OUT_OF_RANGE, call.read())
    assert "start over" in details
