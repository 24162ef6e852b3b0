"""kill -9 of the ledger, the proxy and the controller while a training step is in flight, each brought back as
compose's `restart: unless-stopped` does (same ports, same data), and the run goes on by itself (issue 29).

One CPU run of 5 steps over 10 tasks in each mode, sync and async (the next step's groups run while a step
trains, and are carried over to it); the agents are written against the OpenAI SDK, which retries a call that
found no proxy. The kills: the ledger while step 1's rollouts run, the proxy while step 2's run, the controller
while step 3's run, the ledger again during a weight update (the proxies paused by the trainer). What has to hold
is read from the ledger and the run's files: each step trained once on its 8 rollouts, every rollout ended and
consumed by exactly one step, each with its reward, each task once in the loader's order, no pause left.
"""

from __future__ import annotations

import asyncio
import collections
import json
from pathlib import Path

import pytest

from services._gen.agl.v1 import proxy_control_pb2, rollout_pb2, run_pb2
from services.stack import local_stack
from tests.support.engine import Engine
from tests.trainer import cpu_stack
from tests.trainer.cpu_stack import Stack, endpoint_version, write_tasks
from tests.trainer.faults import LIVE, Trainer, paused_by_the_run, reported_steps, running_rollouts, wait_until

pytestmark = [pytest.mark.trainer, pytest.mark.timeout(1800)]

RUN = "services-killed"
STEPS = 5
AGENT = "tests.trainer.agents:PatientParityAgent"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, cpu_engine: Engine) -> Stack:
    with cpu_stack.start(tmp_path_factory.mktemp("service-kills"), cpu_engine) as started:
        yield started


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_kill_9_of_ledger_proxy_and_controller_mid_step_the_run_goes_on_and_trains_each_rollout_once(
    stack: Stack, cpu_engine: Engine, tmp_path: Path, mode: str
) -> None:
    cpu_engine.restore_base_weights()
    run_id = f"{RUN}-{mode}"
    tasks = write_tasks(tmp_path / "tasks.jsonl", ["parity"] * (2 * STEPS))
    out = stack.root / run_id
    out.mkdir()
    extra = ("agl.async_training.enable=true",) if mode == "async" else ()
    trainer = Trainer(stack, cpu_engine, tasks, out, run_id, steps=STEPS, agent=AGENT, extra=extra)
    proc = trainer.start()
    away: dict[str, float] = {}

    faults = [
        ("ledger", "step 1's rollouts", lambda: running_rollouts(stack, 1, run_id), 2.0),
        ("proxy", "step 2's rollouts", lambda: running_rollouts(stack, 2, run_id), 1.0),
        ("controller", "step 3's rollouts", lambda: running_rollouts(stack, 3, run_id), 0.5),
        ("ledger", "a weight update", lambda: paused_by_the_run(stack, run_id), 1.0),
    ]
    for name, what, ready, down_s in faults:
        wait_until(proc, ready, what, trainer.log)
        away[f"{name} during {what}"] = local_stack.kill_and_restart(stack.services, name, down_s=down_s)
    assert proc.wait(timeout=900) == 0, trainer.log()
    print("seconds each service was away (kill -9 to healthy again):", {k: round(v, 1) for k, v in away.items()})

    # The ledger: each step reported once, each on its 8 rollouts, all of them scored.
    reported = asyncio.run(reported_steps(stack, run_id))
    assert sorted(s for s in reported if s > 0) == list(range(1, STEPS + 1)), reported
    for step in range(1, STEPS + 1):
        assert reported[step].get("agl/rollout/succeeded") == 8.0, (step, reported[step])
    # Every trained token's lag behind the weights it updates: none in sync mode, whose rollouts start after the push.
    lags = {step: reported[step]["agl/async/staleness_max"] for step in range(1, STEPS + 1)}
    print("weights versions:", {s: reported[s]["agl/async/weights_version"] for s in lags}, "largest lags:", lags)
    if mode == "sync":
        assert set(lags.values()) == {0.0}, lags

    # The trajectory log: 8 rollouts a step, none in two steps, each with its reward and its call; each task once,
    # in the loader's order (async: in the order its groups completed, each task's 4 rollouts in one step).
    records = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert collections.Counter(r["step"] for r in records) == dict.fromkeys(range(1, STEPS + 1), 8)
    ids = [r["rollout_id"] for r in records]
    assert len(set(ids)) == len(ids)
    assert all(r["succeeded"] and not r["reward_missing"] and r["calls"] for r in records), [
        (r["rollout_id"], r.get("failure"), len(r["calls"])) for r in records if not r["succeeded"] or not r["calls"]
    ]
    order = [json.loads(r["input"])["id"] if isinstance(r["input"], str) else r["input"]["id"] for r in records]
    tasks_in_order = [f"t{i}" for i in range(2 * STEPS)]
    if mode == "sync":
        assert list(dict.fromkeys(order)) == tasks_in_order, order
    else:
        assert collections.Counter(order) == dict.fromkeys(tasks_in_order, 4), order
        by_task = collections.defaultdict(set)
        for record, task in zip(records, order, strict=True):
            by_task[task].add(record["step"])
        assert all(len(steps) == 1 for steps in by_task.values()), by_task

    # Nothing stranded or left behind: every rollout of the run ended, the run succeeded, the proxies serve.
    async def everything() -> tuple[list[rollout_pb2.Rollout], run_pb2.Run, proxy_control_pb2.ProxyControl]:
        async with stack.client() as client:
            rollouts = await client.list_rollouts(labels={"agl_run": run_id})
            return rollouts, await client.get_run(run_id), await client.get_proxy_control()

    rollouts, run, control = asyncio.run(everything())
    assert [r.rollout_id for r in rollouts if r.status.state in LIVE] == []
    assert {r.rollout_id for r in rollouts} <= set(ids)
    assert run.state == run_pb2.RUN_STATE_SUCCEEDED, run
    assert not control.paused, control
    assert asyncio.run(endpoint_version(stack)) == STEPS
