"""A trainer resumed from a checkpoint older than its manager's last state (trainer/rollouts/rewind.py), against
the real ledger; a background driver finishes every rollout as it appears (controller + agent)."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services._gen.agl.v1 import rollout_pb2
from services.client import LedgerClient, LedgerError
from services.trainer.rollouts.datasets import TaskLoader
from services.trainer.rollouts.manager import RolloutManager, StepResult
from services.trainer.rollouts.specs import LABEL_RUN, Sample
from tests.support.procs import ServiceProcess

from .driver import finish
from .test_manager import settings

LIVE = (rollout_pb2.ROLLOUT_STATE_QUEUING, rollout_pb2.ROLLOUT_STATE_RUNNING)
TASKS = [Sample(f"d{i}", {"q": f"question {i}"}) for i in range(12)]


@contextlib.asynccontextmanager
async def finishing(client: LedgerClient, run_id: str) -> AsyncIterator[Counter[str]]:
    """Finishes every queuing rollout of the run (reward 1.0); counts the finishes per rollout id."""
    finished: Counter[str] = Counter()

    async def loop() -> None:
        while True:
            for rollout in await client.list_rollouts(labels={LABEL_RUN: run_id}):
                if rollout.status.state == rollout_pb2.ROLLOUT_STATE_QUEUING:
                    with contextlib.suppress(LedgerError):  # deleted meanwhile by a rewind
                        await finish(client, rollout.rollout_id)
                        finished[rollout.rollout_id] += 1
            await asyncio.sleep(0.02)

    task = asyncio.create_task(loop())
    try:
        yield finished
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _data_ids(result: StepResult) -> list[str]:
    return sorted({t.data_id for t in result.traces})


# keep_steps 0: the killed pass deleted what it consumed (the rewind creates it again); 2: it is kept, finished
# (the feed delivers it again).
@pytest.mark.parametrize(("mode", "keep_steps"), [("async", 0), ("async", 2), ("sync", 0), ("sync", 2)])
async def test_a_resume_from_an_older_checkpoint_trains_each_task_once(
    ledger: ServiceProcess, run_id: str, tmp_path: Path, mode: str, keep_steps: int
) -> None:
    client = LedgerClient(ledger.address)
    s = settings(
        run_id, tmp_path, mode=mode, train_batch_size=1, async_train_batch_size=3 if mode == "async" else 0,
        keep_steps=keep_steps,
    )  # fmt: skip
    samples = {t.data_id: t for t in TASKS}
    checkpoint = tmp_path / "global_step_1"
    trained: dict[int, list[str]] = {}
    async with finishing(client, run_id):
        # The first pass: step 1, its checkpoint (the loader's position and the manager's snapshot), then step 2,
        # consumed and never saved: the trainer is killed before its checkpoint.
        loader = TaskLoader(TASKS, 1, shuffle=False, seed=0)
        stream = loader.stream()
        first = RolloutManager(client, s, samples=samples)
        await first.start()
        trained[1] = _data_ids(await first.collect(1, stream))
        first.snapshot(checkpoint / "agl_manager_state.json", 1)
        position = loader.state_dict()
        await first.collect(2, stream)
        await first.close()

        # The resumed pass: the loader at step 1's position, the manager rewound to step 1's snapshot.
        loader = TaskLoader(TASKS, 1, shuffle=False, seed=0)
        loader.load_state_dict(position)
        stream = loader.stream()
        second = RolloutManager(client, s, resume_from=checkpoint / "agl_manager_state.json", samples=samples)
        await second.start()
        try:
            for step in (2, 3, 4):
                trained[step] = _data_ids(await second.collect(step, stream))
            in_flight = sorted({g.data_id for g in second.state.groups.values()})
        finally:
            await second.close()
    everything = [d for step in sorted(trained) for d in trained[step]]
    # Each task drawn is trained once or still in flight, never twice, and none is skipped.
    assert len(everything) == len(set(everything)) == 4, trained
    assert not set(everything) & set(in_flight)
    assert sorted(everything + in_flight, key=lambda d: int(d[1:])) == [f"d{i}" for i in range(loader.drawn)]
    # The ledger: nothing of the killed pass is left running.
    left = await client.list_rollouts(labels={LABEL_RUN: run_id})
    in_flight_ids = {i for g in second.state.groups.values() for i in g.rollout_ids}
    assert {r.rollout_id for r in left if r.status.state in LIVE} <= in_flight_ids
    await client.close()
