"""The rollout manager against the real ledger; a test driver finishes the rollouts (controller + agent)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc
import pytest

from services.client import THROUGH_RESTARTS, LedgerClient
from services.trainer.rollouts.hooks import load_hooks
from services.trainer.rollouts.manager import ManagerSettings, RolloutManager
from services.trainer.rollouts.specs import LABEL_GROUP, LABEL_RUN, LABEL_STEP, LaunchSettings, Sample, build_specs
from services.trainer.rollouts.state import load_state
from tests.support.procs import ServiceProcess, free_port, start_ledger

from .driver import finish, wait_rollouts

LAUNCH = LaunchSettings(timeout_seconds=30, agent_class="examples.math_agent:Agent", env_map={"Q": "input.q"})


def samples(prefix: str, count: int = 100):
    return iter([Sample(f"{prefix}{i}", {"q": f"question {i}"}) for i in range(count)])


def settings(run_id: str, tmp_path: Path, **kw) -> ManagerSettings:
    base = {
        "run_id": run_id,
        "n": 2,
        "train_batch_size": 2,
        "launch": LAUNCH,
        "state_path": tmp_path / "state.json",
        "progress": False,
        "flush_interval_s": 0.05,
    }
    base.update(kw)
    return ManagerSettings(**base)


async def until(predicate, timeout_s: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError("condition not met")
        await asyncio.sleep(0.01)


async def test_sync_step_waits_for_every_rollout_then_deletes_them(
    ledger: ServiceProcess, run_id: str, tmp_path: Path
) -> None:
    client = LedgerClient(ledger.address)
    manager = RolloutManager(client, settings(run_id, tmp_path, reward_fillna_value=-1.0))
    await manager.start()
    try:
        task = asyncio.create_task(manager.collect(1, samples("d")))
        ids = await wait_rollouts(client, run_id, 4)
        assert ids == [f"{run_id}-s1-g{g}-r{i}" for g in range(2) for i in range(2)]
        stored = await client.get_rollout(ids[0])
        assert dict(stored.metadata.labels) == {
            LABEL_RUN: run_id, LABEL_STEP: "1", LABEL_GROUP: f"{run_id}-s1-g0", "agl_data_id": "d0"
        }  # fmt: skip
        assert json.loads(stored.input_json) == {"q": "question 0"}
        assert stored.config.timeout_seconds == 30 and stored.config.local.agent_class == "examples.math_agent:Agent"
        assert dict(stored.config.local.env_map) == {"Q": "input.q"}
        await finish(client, ids[0], reward=1.0)
        await finish(client, ids[1], reward=0.0)
        await finish(client, ids[2], reward=0.5, calls=[([1], [2]), ([1, 2, 7], [8])])
        await until(lambda: len(manager.feed.entries) == 3)
        assert not task.done()  # sync mode: one rollout of the step is still running
        await finish(client, ids[3], reward=None, ok=False, calls=[])
        result = await asyncio.wait_for(task, 20)
    finally:
        await manager.close()
    by_id = {t.rollout_id: t for t in result.traces}
    assert sorted(by_id) == ids
    assert by_id[ids[3]].reward == -1.0 and by_id[ids[3]].reward_missing and not by_id[ids[3]].succeeded
    assert [len(by_id[i].triplets) for i in ids] == [1, 1, 2, 0]
    assert {t.group_id for t in result.traces} == {f"{run_id}-s1-g0", f"{run_id}-s1-g1"}
    assert result.metrics["agl/rollout/succeeded"] == 3 and result.metrics["agl/rollout/failed"] == 1
    assert result.metrics["agl/step/created_rollouts"] == 4
    assert result.metrics["agl/rollout/run_time_s/max"] >= 0 and "agl/rollout/queue_wait_s/mean" in result.metrics
    assert result.counts["reward_missing"] == 1
    assert await client.list_rollouts(labels={LABEL_RUN: run_id}) == []
    assert load_state(tmp_path / "state.json").pending == {}
    await client.close()


async def test_async_mode_returns_complete_groups_and_carries_the_rest(
    ledger: ServiceProcess, run_id: str, tmp_path: Path
) -> None:
    client = LedgerClient(ledger.address)
    s = settings(run_id, tmp_path, mode="async", train_batch_size=1, async_train_batch_size=3)
    manager = RolloutManager(client, s)
    await manager.start()
    stream = samples("d")
    try:
        task = asyncio.create_task(manager.collect(1, stream))
        ids = await wait_rollouts(client, run_id, 6)
        g = {k: [f"{run_id}-s1-g{k}-r0", f"{run_id}-s1-g{k}-r1"] for k in range(3)}
        await finish(client, g[0][0])  # group 0: one sibling of two
        await until(lambda: len(manager.feed.entries) == 1)
        assert not task.done()  # no group complete yet
        await finish(client, g[1][0])
        await finish(client, g[1][1])  # group 1 complete
        first = await asyncio.wait_for(task, 20)
        assert {t.group_id for t in first.traces} == {f"{run_id}-s1-g1"}
        assert first.metrics["agl/async/carried_groups"] == 2
        assert first.metrics["agl/async/consumed_age/max"] == 0

        # Before step 2: group 0 and group 2 complete. Step 2 tops up to three groups in flight (one new
        # group) and takes the oldest complete group, in creation order.
        await finish(client, g[0][1])
        await finish(client, g[2][0])
        await finish(client, g[2][1])
        await until(lambda: f"{run_id}-s1-g0" in manager._complete and f"{run_id}-s1-g2" in manager._complete)
        second = await asyncio.wait_for(manager.collect(2, stream), 20)
        new = [f"{run_id}-s2-g0-r0", f"{run_id}-s2-g0-r1"]
    finally:
        await manager.close()
    assert sorted(ids) == sorted(g[0] + g[1] + g[2])
    assert {t.group_id for t in second.traces} == {f"{run_id}-s1-g0"}
    assert second.metrics["agl/async/consumed_age/max"] == 1
    assert second.metrics["agl/step/created_rollouts"] == 2
    assert second.metrics["agl/async/carried_groups"] == 2  # s1-g2 (complete) and s2-g0 (queued)
    assert second.metrics["agl/async/carried_complete_groups"] == 1
    assert second.metrics["agl/async/carried_age/max"] == 1
    left = sorted(r.rollout_id for r in await client.list_rollouts(labels={LABEL_RUN: run_id}))
    assert left == sorted(g[2] + new)
    await client.close()


async def test_restarted_manager_resumes_from_its_cursor_without_loss_or_double_count(
    ledger: ServiceProcess, run_id: str, tmp_path: Path
) -> None:
    client = LedgerClient(ledger.address)
    s = settings(run_id, tmp_path, n=1)
    first = RolloutManager(client, s)
    await first.start()
    task = asyncio.create_task(first.collect(1, samples("d")))
    ids = await wait_rollouts(client, run_id, 2)
    await finish(client, ids[0], reward=0.25)
    await until(lambda: ids[0] in first.feed.entries)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await first.close()
    saved = load_state(tmp_path / "state.json")
    assert set(saved.pending) == {ids[0]} and len(saved.groups) == 2

    await finish(client, ids[1], reward=0.75)  # finishes while no manager runs
    second = RolloutManager(client, s)
    await second.start()
    try:
        result = await asyncio.wait_for(second.collect(1, samples("d")), 20)
        assert sorted(t.rollout_id for t in result.traces) == ids
        assert sorted(t.reward for t in result.traces) == [0.25, 0.75]
        assert result.metrics["agl/step/created_rollouts"] == 0
    finally:
        await second.close()

    # A third manager has nothing pending: the consumed rollouts are not delivered again.
    third = RolloutManager(client, s)
    await third.start()
    try:
        task = asyncio.create_task(third.collect(2, samples("e")))
        step2 = [i for i in await wait_rollouts(client, run_id, 2) if "-s2-" in i]
        for rid in step2:
            await finish(client, rid, reward=1.0)
        result = await asyncio.wait_for(task, 20)
    finally:
        await third.close()
    assert sorted(t.rollout_id for t in result.traces) == sorted(step2)
    await client.close()


HOOKS = """
from services._gen.agl.v1 import event_pb2


class Hooks:
    def on_enqueue(self, spec):
        import json
        data = json.loads(spec.input_json)
        data["hinted"] = True
        spec.input_json = json.dumps(data)
        return spec

    async def on_succeeded(self, rollout, events):
        return [event_pb2.Event(event_type="reward", reward=event_pb2.Reward(value=9.0, source="judge"))]

    def on_failed(self, rollout, events):
        return [event_pb2.Event(event_type="note", data_json='{"failed": true}')]
"""


async def test_hooks_rewrite_requests_and_add_events(ledger: ServiceProcess, run_id: str, tmp_path: Path) -> None:
    path = tmp_path / "my_hooks.py"
    path.write_text(HOOKS)
    client = LedgerClient(ledger.address)
    manager = RolloutManager(client, settings(run_id, tmp_path, n=2, train_batch_size=1), hooks=load_hooks(str(path)))
    await manager.start()
    try:
        task = asyncio.create_task(manager.collect(1, samples("d")))
        ids = await wait_rollouts(client, run_id, 2)
        assert json.loads((await client.get_rollout(ids[0])).input_json) == {"q": "question 0", "hinted": True}
        await finish(client, ids[0], reward=0.0)
        await finish(client, ids[1], reward=None, ok=False)
        result = await asyncio.wait_for(task, 20)
    finally:
        await manager.close()
    by_id = {t.rollout_id: t for t in result.traces}
    assert by_id[ids[0]].reward == 9.0  # the hook's reward comes last
    assert by_id[ids[1]].reward_missing
    assert result.metrics["agl/rollout/hook_events"] == 2
    await client.close()


async def test_hook_events_reach_the_ledger(ledger: ServiceProcess, run_id: str, tmp_path: Path) -> None:
    from services.trainer.rollouts.hooks import on_finished

    path = tmp_path / "hooks.py"
    path.write_text(HOOKS)
    hooks = load_hooks(f"{path}:Hooks")
    client = LedgerClient(ledger.address)
    spec = build_specs(run_id=run_id, step=1, slot=0, sample=Sample("d", {}), n=1, launch=LAUNCH)[0]
    await client.create_rollouts([spec])
    await finish(client, spec.rollout_id, reward=0.0)
    rollout = await client.get_rollout(spec.rollout_id)
    for _ in range(2):  # a restarted manager runs the hook again: the stable event id stores it once
        extra = await on_finished(hooks, rollout, [], True)
        with pytest.raises(grpc.aio.AioRpcError) as refused:  # the rollout has ended: only an explicit opt-in writes
            await client.append_events(extra)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert spec.rollout_id in (refused.value.details() or "") and "succeeded" in (refused.value.details() or "")
        await client.append_events(extra, allow_terminal=True)
    rewards = await client.list_events(spec.rollout_id, event_type="reward")
    assert [e.reward.value for e in rewards] == [0.0, 9.0]
    assert rewards[-1].reward.source == "judge"
    await client.close()


async def test_creation_is_retried_until_the_ledger_answers_without_duplicates(run_id: str, tmp_path: Path) -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    store = f"sqlite:{tmp_path / 'ledger.db'}"
    client = LedgerClient(address)
    s = settings(run_id, tmp_path, n=2, train_batch_size=2, create_attempts=30)
    with start_ledger(store=store, port=port) as first:
        # A first creation whose answer was "lost": the group's specs already exist.
        stream_specs = build_specs(run_id=run_id, step=1, slot=0, sample=Sample("d0", {"q": "question 0"}), n=2,
                                   launch=LAUNCH)  # fmt: skip
        await client.create_rollouts(stream_specs)
        first.terminate()
    manager = RolloutManager(client, s)
    await manager.start()
    task = asyncio.create_task(manager.collect(1, samples("d")))
    await asyncio.sleep(0.3)  # the manager is now retrying against a ledger that is down
    with start_ledger(store=store, port=port):
        # The test's own calls retry as the trainer's do (THROUGH_RESTARTS): gRPC shares one subchannel per address
        # between channels, and after the downtime it may still be in its reconnect backoff (1 s growing 1.6x), so
        # the first calls fail at once with the cached "Connection refused" for longer than the default policy's
        # six tries (under 1.6 s of sleeps) wait. Seen at load 5-20: the client's own channel did not help.
        checker = LedgerClient(address, retry=THROUGH_RESTARTS)
        try:
            ids = await wait_rollouts(checker, run_id, 4)
            assert len(ids) == 4 == len(set(ids))
            for rid in ids:
                await finish(checker, rid)
            result = await asyncio.wait_for(task, 30)
            assert len(result.traces) == 4
        finally:
            await manager.close()
            await client.close()
            await checker.close()


async def test_register_endpoints_sets_the_model_version(ledger: ServiceProcess, run_id: str, tmp_path: Path) -> None:
    client = LedgerClient(ledger.address)
    manager = RolloutManager(client, settings(run_id, tmp_path))
    await manager.register_endpoints(f"{run_id}-model", ["http://10.0.0.1:8000/v1", "http://10.0.0.2:8000/v1"], 7)
    models = await client.list_models(f"{run_id}-model")
    assert sorted((m.endpoint, m.version) for m in models) == [
        ("http://10.0.0.1:8000/v1", 7),
        ("http://10.0.0.2:8000/v1", 7),
    ]
    await client.close()
