"""Retention of consumed rollouts (agl.retention.keep_steps) against the real ledger: the manager runs steps,
a test driver plays controller + agent, and the ledger's own listing says what is left."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from services._gen.agl.v1 import rollout_pb2
from services.client import LedgerClient
from services.trainer.rollouts.manager import ManagerSettings, RolloutManager, StepResult
from services.trainer.rollouts.retention import expired
from services.trainer.rollouts.specs import LABEL_RUN, LABEL_STEP, LaunchSettings, Sample, build_specs
from services.trainer.rollouts.state import load_state
from tests.support.procs import ServiceProcess

from .driver import finish

LAUNCH = LaunchSettings(timeout_seconds=30, agent_class="examples.math_agent:Agent")
QUEUING = rollout_pb2.ROLLOUT_STATE_QUEUING


def settings(run_id: str, tmp_path: Path, keep_steps: int, state: str = "state.json") -> ManagerSettings:
    return ManagerSettings(
        run_id=run_id,
        n=2,
        train_batch_size=1,
        launch=LAUNCH,
        keep_steps=keep_steps,
        state_path=tmp_path / state,
        progress=False,
        flush_interval_s=0.05,
    )


def samples(count: int = 20):
    return iter([Sample(f"d{i}", {"q": f"question {i}"}) for i in range(count)])


def train_ids(run_id: str, *steps: int) -> list[str]:
    return sorted(f"{run_id}-s{step}-g0-r{i}" for step in steps for i in range(2))


async def left(client: LedgerClient, run_id: str) -> list[str]:
    return sorted(r.rollout_id for r in await client.list_rollouts(labels={LABEL_RUN: run_id}))


async def finish_queued(client: LedgerClient, run_id: str, step: int, count: int, reward: float = 1.0) -> None:
    """Waits for `count` queuing rollouts of the step, then finishes them."""
    labels = {LABEL_RUN: run_id, LABEL_STEP: str(step)}
    deadline = asyncio.get_running_loop().time() + 20
    while len(queued := await client.list_rollouts(states=[QUEUING], labels=labels)) < count:
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"{len(queued)} of {count} rollouts of step {step} were created")
        await asyncio.sleep(0.02)
    for rollout in queued:
        await finish(client, rollout.rollout_id, reward=reward)


async def train_step(
    manager: RolloutManager, client: LedgerClient, step: int, stream, reward: float = 1.0
) -> StepResult:
    task = asyncio.create_task(manager.collect(step, stream))
    await finish_queued(client, manager.run_id, step, 2, reward)
    return await asyncio.wait_for(task, 20)


async def validate(manager: RolloutManager, client: LedgerClient, step: int) -> StepResult:
    task = asyncio.create_task(manager.evaluate(step, [Sample("v0", {"q": "held out"})]))
    await finish_queued(client, manager.run_id, step, 1)
    return await asyncio.wait_for(task, 20)


async def test_keep_two_steps_leaves_the_last_two_steps_validation_included(
    ledger: ServiceProcess, run_id: str, tmp_path: Path
) -> None:
    client = LedgerClient(ledger.address)
    manager = RolloutManager(client, settings(run_id, tmp_path, keep_steps=2))
    await manager.start()
    stream = samples()
    try:
        await validate(manager, client, 0)
        await train_step(manager, client, 1, stream)
        assert await left(client, run_id) == sorted([f"{run_id}-v0-g0-r0", *train_ids(run_id, 1)])
        await train_step(manager, client, 2, stream)
        assert await left(client, run_id) == train_ids(run_id, 1, 2)  # step 0's validation fell out
        for step in (3, 4):
            await train_step(manager, client, step, stream)
        assert await left(client, run_id) == train_ids(run_id, 3, 4)
        await validate(manager, client, 4)
    finally:
        await manager.close()
    assert await left(client, run_id) == sorted([f"{run_id}-v4-g0-r0", *train_ids(run_id, 3, 4)])
    saved = load_state(tmp_path / "state.json")
    assert saved.to_delete == [] and saved.pending == {} and saved.groups == {}
    await client.close()


async def test_keep_zero_deletes_after_each_step(ledger: ServiceProcess, run_id: str, tmp_path: Path) -> None:
    client = LedgerClient(ledger.address)
    manager = RolloutManager(client, settings(run_id, tmp_path, keep_steps=0))
    await manager.start()
    stream = samples()
    try:
        for step in (1, 2, 3, 4):
            result = await train_step(manager, client, step, stream)
            assert len(result.traces) == 2
            assert await left(client, run_id) == []
    finally:
        await manager.close()
    await client.close()


async def test_keep_all_leaves_every_step(ledger: ServiceProcess, run_id: str, tmp_path: Path) -> None:
    client = LedgerClient(ledger.address)
    manager = RolloutManager(client, settings(run_id, tmp_path, keep_steps=-1))
    await manager.start()
    stream = samples()
    try:
        for step in (1, 2, 3, 4):
            await train_step(manager, client, step, stream)
    finally:
        await manager.close()
    assert await left(client, run_id) == train_ids(run_id, 1, 2, 3, 4)
    stored = await client.get_rollout(f"{run_id}-s1-g0-r0")
    assert stored.status.state == rollout_pb2.ROLLOUT_STATE_SUCCEEDED and stored.metadata.labels[LABEL_STEP] == "1"
    await client.close()


async def test_a_restarted_trainer_deletes_the_steps_an_earlier_one_kept(
    ledger: ServiceProcess, run_id: str, tmp_path: Path
) -> None:
    client = LedgerClient(ledger.address)
    stream = samples()
    first = RolloutManager(client, settings(run_id, tmp_path, keep_steps=-1))
    await first.start()
    try:
        for step in (1, 2, 3):
            await train_step(first, client, step, stream)
    finally:
        await first.close()
    assert await left(client, run_id) == train_ids(run_id, 1, 2, 3)

    # Same run id and state file, a new process: it never consumed steps 1 and 2, yet deletes them.
    second = RolloutManager(client, settings(run_id, tmp_path, keep_steps=2))
    await second.start()
    try:
        await train_step(second, client, 4, stream)
    finally:
        await second.close()
    assert await left(client, run_id) == train_ids(run_id, 3, 4)

    # A third one with a fresh state file (the state directory lost) prunes from the ledger alone.
    third = RolloutManager(client, settings(run_id, tmp_path, keep_steps=1, state="fresh.json"))
    await third.start()
    try:
        await train_step(third, client, 5, stream)
    finally:
        await third.close()
    assert await left(client, run_id) == train_ids(run_id, 5)
    await client.close()


async def test_other_runs_rollouts_are_never_touched(ledger: ServiceProcess, run_id: str, tmp_path: Path) -> None:
    client = LedgerClient(ledger.address)
    # Another run whose id starts with this one's, at the same steps: finished, running and queued rollouts.
    other = f"{run_id}-other"
    specs = [
        spec
        for step in (1, 2)
        for spec in build_specs(run_id=other, step=step, slot=0, sample=Sample("o", {"q": "other"}), n=2, launch=LAUNCH)
    ]
    unlabelled = rollout_pb2.RolloutSpec(rollout_id=f"{run_id}-s1-g9-r0", input_json="{}", config=LAUNCH.to_proto())
    await client.create_rollouts([*specs, unlabelled])
    for spec in specs[:3]:
        await finish(client, spec.rollout_id)
    await finish(client, unlabelled.rollout_id)
    before = {r.rollout_id: r.status.state for r in await client.list_rollouts(labels={LABEL_RUN: other})}

    manager = RolloutManager(client, settings(run_id, tmp_path, keep_steps=0))
    await manager.start()
    stream = samples()
    try:
        for step in (1, 2, 3):
            await train_step(manager, client, step, stream)
    finally:
        await manager.close()
    assert await left(client, run_id) == []
    after = {r.rollout_id: r.status.state for r in await client.list_rollouts(labels={LABEL_RUN: other})}
    assert after == before and len(after) == 4
    assert (await client.get_rollout(unlabelled.rollout_id)).status.state == rollout_pb2.ROLLOUT_STATE_SUCCEEDED
    await client.close()


async def test_a_step_run_again_replaces_its_kept_rollouts(ledger: ServiceProcess, run_id: str, tmp_path: Path) -> None:
    """Resuming from a checkpoint older than the last step: the kept rollouts of that step run again, instead of
    the step waiting for terminal entries the feed received long ago (creating an existing id is a no-op)."""
    client = LedgerClient(ledger.address)
    stream = samples()
    first = RolloutManager(client, settings(run_id, tmp_path, keep_steps=-1))
    await first.start()
    try:
        await train_step(first, client, 1, stream, reward=1.0)
        await train_step(first, client, 2, stream, reward=1.0)
    finally:
        await first.close()

    second = RolloutManager(client, settings(run_id, tmp_path, keep_steps=-1))
    await second.start()
    try:
        again = await train_step(second, client, 2, samples(), reward=0.25)
    finally:
        await second.close()
    assert sorted(t.rollout_id for t in again.traces) == train_ids(run_id, 2)
    assert [t.reward for t in again.traces] == [0.25, 0.25]
    assert again.metrics["agl/step/created_rollouts"] == 2
    assert await left(client, run_id) == train_ids(run_id, 1, 2)
    await client.close()


def _rollout(rollout_id: str, step: str | None, state: int) -> rollout_pb2.Rollout:
    rollout = rollout_pb2.Rollout(rollout_id=rollout_id)
    if step is not None:
        rollout.metadata.labels[LABEL_STEP] = step
    rollout.status.state = state
    return rollout


def test_expired_picks_only_finished_rollouts_of_old_steps_not_in_flight() -> None:
    done, failed, running = (
        rollout_pb2.ROLLOUT_STATE_SUCCEEDED,
        rollout_pb2.ROLLOUT_STATE_FAILED,
        rollout_pb2.ROLLOUT_STATE_RUNNING,
    )
    rollouts = [
        _rollout("old-done", "1", done),
        _rollout("old-failed", "2", failed),
        _rollout("old-running", "1", running),
        _rollout("old-carried", "2", done),
        _rollout("no-step", None, done),
        _rollout("bad-step", "x", done),
        _rollout("kept", "3", done),
        _rollout("later", "9", done),
    ]
    pick = expired(rollouts, latest_step=4, keep_steps=2, in_flight={"old-carried"})
    assert pick == ["old-done", "old-failed"]
    assert expired(rollouts, latest_step=4, keep_steps=-1, in_flight=()) == []
    assert expired(rollouts, latest_step=3, keep_steps=0, in_flight=()) == [
        "old-done", "old-failed", "old-carried", "kept"
    ]  # fmt: skip


@pytest.mark.trainer
def test_config_defaults_to_two_steps_and_rejects_a_bad_window() -> None:
    from hydra import compose, initialize_config_dir

    from services.trainer.config import CONFIG_DIR, CONFIG_NAME, ConfigError, settings_from_config

    def build(*overrides: str):
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
            return settings_from_config(
                compose(config_name=CONFIG_NAME, overrides=["agl.launch.agent_class=a:B", *overrides])
            )

    assert build().manager.keep_steps == 2
    assert build("agl.retention.keep_steps=-1").manager.keep_steps == -1
    assert build("agl.retention.keep_steps=0").manager.keep_steps == 0
    with pytest.raises(ConfigError, match=r"agl\.retention\.keep_steps=-2"):
        build("agl.retention.keep_steps=-2")
    with pytest.raises(ConfigError, match=r"agl\.retention\.keep_steps='all'"):
        build("agl.retention.keep_steps=all")


async def test_the_manager_refuses_a_bad_window(ledger: ServiceProcess) -> None:
    client = LedgerClient(ledger.address)
    with pytest.raises(ValueError, match="keep_steps=-3"):
        RolloutManager(client, ManagerSettings(run_id="r", keep_steps=-3))
    await client.close()
