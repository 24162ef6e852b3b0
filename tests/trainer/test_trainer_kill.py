"""kill -9 of the trainer in the middle of a run, then the same command again, as an operator would (issue 29).

One CPU run of 4 steps over 8 tasks (one epoch, a checkpoint every step) is killed three times at three points of
a step: while its rollouts run, during the update (every rollout of the step ended, nothing saved yet), and right
after its checkpoint was written (before the step is reported). Each time the same `agl-trainer` command is
started again. What has to hold afterwards is read from the ledger and from the run's files, not only that the run
finished: no rollout stranded in queuing or running, none trained on by two steps, each task of the epoch trained
once in the loader's order, every step's metrics exactly once in the metrics file and in the ledger.
"""

from __future__ import annotations

import asyncio
import collections
import json
import re
import signal
import time
import uuid
from pathlib import Path

import pytest

from services._gen.agl.v1 import proxy_control_pb2, rollout_pb2, run_pb2
from tests.support.engine import Engine
from tests.trainer import cpu_stack
from tests.trainer.cpu_stack import Stack, endpoint_version, write_tasks
from tests.trainer.faults import (
    LIVE,
    RUN,
    STEPS,
    Trainer,
    checkpointed,
    gone_after,
    kill_when,
    logged_steps,
    reported_steps,
    step_rollouts,
)

pytestmark = [pytest.mark.trainer, pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, cpu_engine: Engine) -> Stack:
    with cpu_stack.start(tmp_path_factory.mktemp("trainer-kill"), cpu_engine) as started:
        yield started


def test_kill_9_at_three_points_of_a_step_then_the_same_command_finishes_the_run_exactly_once(
    stack: Stack, cpu_engine: Engine, tmp_path: Path
) -> None:
    cpu_engine.restore_base_weights()
    tasks = write_tasks(tmp_path / "tasks.jsonl", ["parity"] * (2 * STEPS))
    out = stack.root / RUN
    out.mkdir()
    trainer = Trainer(stack, cpu_engine, tasks, out)

    # 1. An operator's kill -9 of the trainer's pid while step 2's rollouts run (step 1 checkpointed). The run
    # goes with it at once: no part of it (its Ray task runner, workers, helpers) goes on training.
    def step_2_running() -> bool:
        live = [r for r in asyncio.run(step_rollouts(stack, 2)) if r.status.state in LIVE]
        return checkpointed(out) == 1 and bool(live)

    killed_at = kill_when(trainer.start(), step_2_running, "step 2's rollouts", trainer.log, group=False)
    print(f"kill -9 of the pid: every process of the run gone after {gone_after(out, killed_at):.1f}s")
    assert checkpointed(out) == 1 and 2 not in logged_steps(out), trainer.log()

    # 2. The trainer's group killed during step 2's update: this pass collected step 2 (its trajectories are
    # written as the update starts) and has neither reported nor saved it.
    killed_at = kill_when(trainer.start(), lambda: 2 in logged_steps(out), "step 2's update", trainer.log, group=True)
    gone_after(out, killed_at)
    assert checkpointed(out) == 1 and 2 not in asyncio.run(reported_steps(stack)), trainer.log()
    # It had gone back to the checkpoint's rollout state first (services/trainer/rollouts/rewind.py).
    assert "rewound to the checkpoint of step 1" in trainer.log(whole=True)

    # 3. Killed once step 3 is reported: before its checkpoint, or just after it (whichever the 50 ms poll hits).
    killed_at = kill_when(
        trainer.start(), lambda: 3 in asyncio.run(reported_steps(stack)), "step 3's report", trainer.log, group=True
    )
    gone_after(out, killed_at)
    print(f"step 3 reported; the kill found the checkpoint of step {checkpointed(out)}")

    last = trainer.start()
    assert last.wait(timeout=900) == 0, trainer.log()

    # The ledger: each step once (a step redone after a resume replaces its killed pass's report).
    reported = asyncio.run(reported_steps(stack))
    assert sorted(s for s in reported if s > 0) == [1, 2, 3, 4]
    assert all(reported[s].get("agl/rollout/succeeded") == 8.0 for s in (1, 2, 3, 4)), reported

    # The trajectory log: each step's 8 rollouts once, no rollout in two steps, each task once, in the loader's order.
    records = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    by_step = collections.Counter(r["step"] for r in records)
    assert by_step == {1: 8, 2: 8, 3: 8, 4: 8}, by_step
    ids = [r["rollout_id"] for r in records]
    assert len(set(ids)) == len(ids)
    order = [json.loads(r["input"])["id"] if isinstance(r["input"], str) else r["input"]["id"] for r in records]
    firsts = list(dict.fromkeys(order))
    assert firsts == [f"t{i}" for i in range(2 * STEPS)], order

    # The ledger: nothing stranded; retention kept the last two steps' rollouts, each ended.
    async def everything() -> list[rollout_pb2.Rollout]:
        async with stack.client() as client:
            return await client.list_rollouts(labels={"agl_run": RUN})

    rollouts = asyncio.run(everything())
    assert [r.rollout_id for r in rollouts if r.status.state in LIVE] == []
    kept = collections.Counter(r.metadata.labels["agl_step"] for r in rollouts)
    assert kept == {"3": 8, "4": 8}, kept
    assert {r.rollout_id for r in rollouts} <= set(ids)

    async def run_state() -> int:
        async with stack.client() as client:
            return (await client.get_run(RUN)).state

    assert asyncio.run(run_state()) == run_pb2.RUN_STATE_SUCCEEDED
    assert asyncio.run(endpoint_version(stack)) == STEPS


def test_ctrl_c_and_sigterm_stop_the_trainer_at_once_with_one_line_and_no_pause_left(
    stack: Stack, cpu_engine: Engine, tmp_path: Path
) -> None:
    # A run of its own each time, so the test can be repeated on the module's stack (20 rounds: issue 48).
    run_id = f"stopped-{uuid.uuid4().hex[:6]}"
    cpu_engine.restore_base_weights()
    tasks = write_tasks(tmp_path / "tasks.jsonl", ["parity"] * (2 * STEPS))
    out = stack.root / run_id
    out.mkdir()
    trainer = Trainer(stack, cpu_engine, tasks, out, run_id)

    async def run_and_control() -> tuple[run_pb2.Run, proxy_control_pb2.ProxyControl]:
        async with stack.client() as client:
            return await client.get_run(run_id), await client.get_proxy_control()

    # Ctrl-C in the trainer's terminal (SIGINT to its whole group) once step 1 is on record and saved.
    proc = trainer.start()
    sent = kill_when(
        proc, lambda: checkpointed(out) == 1, "step 1's checkpoint", trainer.log, group=True, sig=signal.SIGINT
    )
    print(f"SIGINT: the trainer exited after {time.monotonic() - sent:.1f}s")
    assert proc.returncode == 128 + signal.SIGINT, trainer.log()
    gone_after(out, sent, limit_s=30)
    text = trainer.log(whole=True)
    lines = [line for line in text.splitlines() if "interrupted by SIGINT" in line]
    assert len(lines) == 1, text[-4000:]
    # The step it names is the last one on record, the checkpoint the one a rerun resumes from: a step here takes
    # about a second, so the next one may have run on (even into its update, whose pause is then lifted) between
    # the poll and the signal.
    said = re.fullmatch(
        r"agl-trainer: interrupted by SIGINT after step (\d+); the run is marked interrupted in the ledger"
        r"(?:, the proxies resumed)?\. "
        r"The same command resumes from the checkpoint of step (\d+)\.",
        lines[0],
    )
    assert said, lines[0]
    assert int(said[1]) == max(asyncio.run(reported_steps(stack, run_id))) and int(said[2]) == checkpointed(out)
    assert "Traceback" not in text, text[-4000:]
    run, control = asyncio.run(run_and_control())
    assert run.state == run_pb2.RUN_STATE_FAILED and run.error_message == f"interrupted by SIGINT after step {said[1]}"
    assert not control.paused

    # SIGTERM to the trainer's pid (systemd, `docker stop`) during an update: no pause is left (lifted by the stop,
    # or by the update itself if it ended first; test_interruption.py has the lifting on its own).
    def paused_by_this_run() -> bool:
        control = asyncio.run(run_and_control())[1]
        return control.paused and control.owner == f"trainer:{run_id}"

    proc = trainer.start()
    sent = kill_when(proc, paused_by_this_run, "a weight update", trainer.log, group=False, sig=signal.SIGTERM)
    print(f"SIGTERM: the trainer exited after {time.monotonic() - sent:.1f}s")
    assert proc.returncode == 128 + signal.SIGTERM, trainer.log()
    gone_after(out, sent, limit_s=30)
    text = trainer.log(whole=True)
    assert "Traceback" not in text, text[-4000:]
    assert "agl-trainer: interrupted by SIGTERM after step " in text, text[-3000:]
    run, control = asyncio.run(run_and_control())
    assert run.state == run_pb2.RUN_STATE_FAILED and "interrupted by SIGTERM" in run.error_message
    assert not control.paused, control
