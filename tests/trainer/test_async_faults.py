"""Faults in async mode (issue 29): the next step's groups run while a step trains and are carried over to it, so a
fault always finds rollouts of two steps in flight. One CPU run of 4 steps on an engine of its own, a checkpoint
every step:
1. kill -9 of the engine while step 2's rollouts run, restarted on its port from its base model (as compose's
   `restart: unless-stopped` does): the proxy holds it back, the trainer catches it up, the agents wait;
2. kill -9 of the trainer's process group during step 3's update, with step 4's groups in flight: the same command
   again rewinds the ledger to the last checkpoint (services/trainer/rollouts/rewind.py) and finishes the run.
What has to hold is read from the ledger and the run's files: each step reported once on its 8 rollouts, no rollout
in two steps, each task's 4 rollouts in one step, nothing left queuing or running, no pause left, the restarted
engine at the last push."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from services._gen.agl.v1 import proxy_control_pb2, rollout_pb2, run_pb2
from services.engine.control import EngineControl
from tests.support.engine import build_model, chat, run_engine
from tests.support.procs import free_port
from tests.trainer import cpu_stack
from tests.trainer.cpu_stack import endpoint_version, write_tasks
from tests.trainer.faults import (
    LIVE,
    Trainer,
    checkpointed,
    gone_after,
    kill_when,
    logged_steps,
    reported_steps,
    running_rollouts,
    step_rollouts,
    wait_until,
)

pytestmark = [pytest.mark.trainer, pytest.mark.timeout(1800)]

RUN = "async-faults"
STEPS = 4
AGENT = "tests.trainer.agents:PatientParityAgent"


def test_async_run_survives_an_engine_kill_and_a_trainer_kill_with_groups_in_flight(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    root = tmp_path_factory.mktemp("async-faults")
    model_dir = build_model(root / "model")
    port = free_port()
    with contextlib.ExitStack() as running:
        engines = running.enter_context(contextlib.ExitStack())  # stopped after the stack
        engine = engines.enter_context(run_engine(model_dir, log_dir=root, port=port))
        chat(engine, "warm up")
        stack = running.enter_context(cpu_stack.start(root / "stack", engine))
        tasks = write_tasks(tmp_path / "tasks.jsonl", ["parity"] * (2 * STEPS))
        out = stack.root / RUN
        out.mkdir()
        # The rollouts in flight at the engine's kill outlast its restart: the agents wait on the proxy.
        extra = ("agl.async_training.enable=true", "trainer.save_freq=1", "agl.launch.timeout_seconds=400")
        trainer = Trainer(stack, engine, tasks, out, RUN, steps=STEPS, agent=AGENT, extra=extra)
        proc = trainer.start()

        # 1. The engine, while step 2's rollouts run.
        wait_until(proc, lambda: running_rollouts(stack, 2, RUN), "step 2's rollouts", trainer.log)
        killed = time.monotonic()
        os.killpg(engine.proc.pid, signal.SIGKILL)
        engine.proc.wait()
        restarted = engines.enter_context(run_engine(model_dir, log_dir=root / "restarted", port=port))
        engine_back_s = time.monotonic() - killed

        # 2. The trainer's group, once step 3's update has begun (its trajectories are written as it starts) while
        # step 4's groups are in flight; the same command again.
        def step_3_training_with_step_4_in_flight() -> bool:
            live = [r for r in asyncio.run(step_rollouts(stack, 4, RUN)) if r.status.state in LIVE]
            return 3 in logged_steps(out) and bool(live)

        killed_at = kill_when(proc, step_3_training_with_step_4_in_flight, "step 3's update", trainer.log, group=True)
        gone_after(out, killed_at)
        # A step takes about a second here: the kill finds step 3 unsaved, or (the poll a moment late) saved, with
        # step 4's groups in flight either way.
        resumed_from = checkpointed(out)
        assert resumed_from in (2, 3), trainer.log()
        last = trainer.start()
        assert last.wait(timeout=900) == 0, trainer.log()
        assert f"rewound to the checkpoint of step {resumed_from}" in trainer.log(whole=True)

        async def label() -> str:
            async with EngineControl(restarted.url) as control:
                return await control.weight_version()

        served = asyncio.run(label())
        reported = asyncio.run(reported_steps(stack, RUN))

        async def everything() -> tuple[list[rollout_pb2.Rollout], run_pb2.Run, proxy_control_pb2.ProxyControl]:
            async with stack.client() as client:
                rollouts = await client.list_rollouts(labels={"agl_run": RUN})
                return rollouts, await client.get_run(RUN), await client.get_proxy_control()

        rollouts, run, control = asyncio.run(everything())
        version = asyncio.run(endpoint_version(stack))
        proxy_log = stack.services["proxy"].log_path.read_text(errors="replace")
    print(f"the engine was back {engine_back_s:.1f}s after kill -9; the trainer resumed from step {resumed_from}")

    # The ledger: each step once (step 3 redone by the resumed pass), each on its 8 rollouts, every one succeeded:
    # the agents waited out the engine's restart instead of failing.
    assert sorted(s for s in reported if s > 0) == list(range(1, STEPS + 1)), reported
    for step in range(1, STEPS + 1):
        assert reported[step].get("agl/rollout/succeeded") == 8.0, (step, reported[step])
        assert reported[step].get("agl/health/failed_calls") == 0.0, (step, reported[step])
    caught = [reported[s].get("agl/push/caught_up_engines", 0.0) for s in range(1, STEPS + 1)]
    assert sum(caught) >= 1.0, caught  # the restarted engine got the current weights from the trainer
    unavailable = [reported[s].get("agl/health/engine_unavailable_calls", 0.0) for s in range(1, STEPS + 1)]
    assert sum(unavailable) > 0, unavailable  # and some call found it away meanwhile

    # The trajectory log: 8 rollouts a step, none in two steps, each task's 4 rollouts in one step, all 8 tasks.
    records = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert collections.Counter(r["step"] for r in records) == dict.fromkeys(range(1, STEPS + 1), 8)
    ids = [r["rollout_id"] for r in records]
    assert len(set(ids)) == len(ids)
    assert all(r["succeeded"] and r["calls"] for r in records)
    order = [json.loads(r["input"])["id"] if isinstance(r["input"], str) else r["input"]["id"] for r in records]
    assert collections.Counter(order) == {f"t{i}": 4 for i in range(2 * STEPS)}, order
    by_task = collections.defaultdict(set)
    for record, task in zip(records, order, strict=True):
        by_task[task].add(record["step"])
    assert all(len(steps) == 1 for steps in by_task.values()), by_task

    # Nothing stranded or left behind; the restarted engine took every later push and is routed to again.
    assert [r.rollout_id for r in rollouts if r.status.state in LIVE] == []
    assert {r.rollout_id for r in rollouts} <= set(ids)
    assert run.state == run_pb2.RUN_STATE_SUCCEEDED, run
    assert not control.paused, control
    assert version == STEPS and served == str(STEPS)
    url = re.escape(restarted.openai_url)
    held = re.search(rf"engine {url} held back for model \S+: ", proxy_log)
    assert held, proxy_log
    assert re.compile(rf"engine {url} serves what model \S+ is registered with again").search(proxy_log, held.end())
