"""The guardrails in the real trainer: `agl-trainer placement=cpu` (verl's actor on CPU) against the real ledger,
proxy and controller and the session's CPU vLLM engine, with agents that fail on purpose.

Validation runs first (its agents answer), then every training rollout crashes: the run stops at step 1 with one
line naming the first agent error (rollout id, the agent's log path, its last line), exits non-zero, and the
ledger has the run FAILED with that line and step 1's health on record (`agl run ID --health` shows it). The
validation records of the trajectory log carry their calls' text."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from services._gen.agl.v1 import run_pb2
from services.stack import local_stack
from tests.support.engine import Engine
from tests.trainer import cpu_stack
from tests.trainer.cpu_stack import KEY, Stack, TrainerRun, trainer_overrides

pytestmark = [pytest.mark.trainer, pytest.mark.timeout(900)]

TRAINER = Path(sys.executable).with_name("agl-trainer")
AGL = Path(sys.executable).with_name("agl")
AGENT = "tests.trainer.faulty_agents:FaultyAgent"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, cpu_engine: Engine) -> Iterator[Stack]:
    with cpu_stack.start(tmp_path_factory.mktemp("training-stops"), cpu_engine) as started:
        yield started


def write(path: Path, modes: list[str]) -> Path:
    path.write_text("".join(json.dumps({"id": f"{path.stem}{i}", "q": f"task {i}", "mode": m}) + "\n" for i, m in
                            enumerate(modes)))  # fmt: skip
    return path


def test_a_step_whose_every_rollout_crashed_stops_the_run_with_the_first_agent_error(
    stack: Stack, cpu_engine: Engine, tmp_path: Path
) -> None:
    run_id = "stop-crash"
    train = write(tmp_path / "train.jsonl", ["crash", "crash"])
    val = write(tmp_path / "val.jsonl", ["ok", "ok"])
    out = stack.root / run_id
    out.mkdir()
    argv = [str(TRAINER), f"agl.ledger_address={stack.ledger}", f"agl.key={KEY}"]
    argv += trainer_overrides(cpu_engine, run_id, train, out, steps=2, lr=1e-3, agent=AGENT)
    argv += [f"data.val_files={val}", "trainer.val_before_train=true"]
    env = local_stack.child_environment({"VERL_FILE_LOGGER_PATH": str(out / "metrics.jsonl")})
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=850, check=False)
    run = TrainerRun.read(proc.returncode, proc.stdout + proc.stderr, out)

    assert run.returncode != 0, run.output[-5000:]
    first = f"{run_id}-s1-g0-r0"
    logs = stack.root / "agent-logs"
    # One line of the trainer's own (Ray's forwarded worker output aside), no traceback.
    [last] = [line for line in proc.stderr.splitlines() if line.startswith("agl-trainer:")]
    assert "Traceback" not in proc.stderr
    assert last.startswith(
        f"agl-trainer: health stop: step 1: every rollout failed (8 of 8); first: rollout {first} (EXIT_CODE): "
        f"agent exited with code 1 (log: {logs}"
    ), run.output[-5000:]
    assert last.endswith("ValueError: no answer to 'task 0'"), last

    async def recorded() -> tuple[run_pb2.Run, list[run_pb2.RunStep]]:
        async with stack.client() as client:
            return await client.get_run(run_id), await client.list_run_steps(run_id)

    ledger_run, steps = asyncio.run(recorded())
    assert ledger_run.state == run_pb2.RUN_STATE_FAILED
    assert ledger_run.error_message == last.removeprefix("agl-trainer: ")
    step_1 = next(s for s in steps if s.step == 1).metrics
    assert step_1["agl/health/failed_rollouts"] == 1.0 and step_1["agl/health/stopped"] == 1.0
    assert step_1["agl/health/infra_failed_rollouts"] == 0.0 and step_1["agl/infra/killed"] == 0.0
    # Step 0 is validation's: its agents answered.
    assert next(s for s in steps if s.step == 0).metrics["val/agl/health/rollouts_without_calls"] == 0.0
    assert [r["step"] for r in run.metrics if r["step"] > 0] == [1]  # nothing was trained on

    health = subprocess.run(
        [str(AGL), "--ledger", stack.ledger, "--key", KEY, "run", run_id, "--health"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert health.returncode == 0, health.stderr
    assert "step 1: agl/health/failed_rollouts=1 over the warn limit 0.25" in health.stdout.splitlines()

    records = [json.loads(line) for line in run.trajectories.read_text().splitlines()]
    validation = [r for r in records if r["kind"] == "validation"]
    assert len(validation) == 2
    for record in validation:
        [call] = record["calls"]
        assert f"user: task {record['data_id'][-1]}" in call["prompt"] and call["response"].startswith("assistant: ")
        assert call["response_tokens"] > 0
    crashed = [r for r in records if r["kind"] == "train"]
    assert len(crashed) == 8 and all(r["failure_reason"] == "EXIT_CODE" and len(r["calls"]) == 1 for r in crashed)


def test_agents_that_never_call_the_model_stop_the_run_over_the_limit(
    stack: Stack, cpu_engine: Engine, tmp_path: Path
) -> None:
    run_id = "stop-nocall"
    train = write(tmp_path / "train.jsonl", ["no_call", "no_call"])
    out = stack.root / run_id
    out.mkdir()
    argv = [str(TRAINER), f"agl.ledger_address={stack.ledger}", f"agl.key={KEY}"]
    argv += trainer_overrides(cpu_engine, run_id, train, out, steps=2, lr=1e-3, agent=AGENT)
    # A limit from the command line reaches the trainer (and the line names it).
    argv += ["+agl.health.limits.rollouts_without_calls.stop=0.9", "agl.health.rollouts_named=2"]
    env = local_stack.child_environment({"VERL_FILE_LOGGER_PATH": str(out / "metrics.jsonl")})
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=850, check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output[-5000:]
    [last] = [line for line in proc.stderr.splitlines() if line.startswith("agl-trainer:")]
    assert last == (
        "agl-trainer: health stop: step 1: agl/health/rollouts_without_calls=1 (8 of 8) over the stop limit 0.9; "
        f"rollouts: {run_id}-s1-g0-r0, {run_id}-s1-g0-r1 and 6 more"
    ), output[-5000:]
    assert "Traceback" not in proc.stderr

    async def recorded() -> tuple[run_pb2.Run, list[run_pb2.RunStep], list[dict]]:
        async with stack.client() as client:
            events = await client.list_events(f"{run_id}-s1-g0-r0", event_type="agl_training_rows")
            return (
                await client.get_run(run_id),
                await client.list_run_steps(run_id),
                [json.loads(e.data_json) for e in events],
            )

    ledger_run, steps, rows = asyncio.run(recorded())
    assert ledger_run.state == run_pb2.RUN_STATE_FAILED and ledger_run.error_message == last.removeprefix(
        "agl-trainer: "
    )
    assert json.loads(ledger_run.config_json)["health_limits"]["agl/health/rollouts_without_calls"]["stop"] == 0.9
    [step_1] = [s.metrics for s in steps if s.step == 1]
    assert step_1["agl/health/rollouts_without_calls"] == 1.0 and step_1["agl/health/stopped"] == 1.0
    # The stopping step's rollouts carry the trainer's record: no rows, counted in the metric that stopped the run.
    [record] = rows
    assert record["step"] == 1 and record["rows"] == [] and "rollouts_without_calls" in record["flags"]
