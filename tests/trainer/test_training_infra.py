"""Infrastructure failures kept out of the advantage in the real trainer: `agl-trainer placement=cpu` against the real
ledger, proxy and controller and the session's CPU engine, while the test's fault injector SIGKILLs agents from
outside. One group's agents are killed on their first attempt only (the ledger retries them, they train), another's
on every attempt (left out with their group, counted as KILLED), the third is clean; the step trains on the rest.
The second step loses every rollout of its first try to the infrastructure (each agent dies by a signal on both
attempts): the trainer runs its tasks again rather than stopping, and the redo trains as the first step did."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.stack import local_stack
from tests.support.engine import Engine
from tests.trainer import cpu_stack
from tests.trainer.cpu_stack import KEY, Stack, TrainerRun, trainer_overrides
from tests.trainer.test_failure_modes import fault_injector

pytestmark = [pytest.mark.trainer, pytest.mark.timeout(900)]

TRAINER = Path(sys.executable).with_name("agl-trainer")
AGENT = "tests.trainer.faulty_agents:FaultyAgent"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, cpu_engine: Engine) -> Iterator[Stack]:
    with cpu_stack.start(tmp_path_factory.mktemp("training-infra"), cpu_engine) as started:
        yield started


async def train_with_faults(argv: list[str], env: dict[str, str], faults: Path, kill_once: set[str]):
    async with fault_injector(faults, kill_once) as killed:
        proc = await asyncio.create_subprocess_exec(
            *argv, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        out, err = await asyncio.wait_for(proc.communicate(), 850)
    return proc.returncode, out.decode() + err.decode(), list(killed)


def test_killed_rollouts_are_retried_then_left_out_of_their_group(
    stack: Stack, cpu_engine: Engine, tmp_path: Path
) -> None:
    run_id = "infra-kill"
    faults = tmp_path / "faults"
    faults.mkdir()
    modes = ["kill_once", "kill", "ok"]
    lost = [f"{run_id}-s2-g{slot}-" for slot in range(3)]  # step 2's first try
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        "".join(json.dumps({"id": f"t{i}", "q": f"task {i}", "mode": m, "faults": str(faults), "lost_groups": lost})
                + "\n" for i, m in enumerate(modes))
    )  # fmt: skip
    out = stack.root / run_id
    out.mkdir()
    argv = [str(TRAINER), f"agl.ledger_address={stack.ledger}", f"agl.key={KEY}"]
    argv += trainer_overrides(cpu_engine, run_id, tasks, out, steps=2, lr=1e-3, agent=AGENT, tasks_per_step=3)
    argv += ["agl.infra_failures.retry_attempts=2", "agl.infra_failures.policy=drop_rollout"]
    env = local_stack.child_environment({"VERL_FILE_LOGGER_PATH": str(out / "metrics.jsonl")})
    cpu_engine.restore_base_weights()
    # Step 2's redo takes the slots after the first try's: 3 (kill_once), 4 (kill), 5 (ok).
    kill_once = {f"{run_id}-s{s}-g{g}-r{k}" for s, g in ((1, 0), (2, 3)) for k in range(4)}
    code, output, killed = asyncio.run(train_with_faults(argv, env, faults, kill_once))
    run = TrainerRun.read(code, output, out)
    assert run.returncode == 0, run.output[-5000:]
    # Group 0 (3 in the redo) killed once each (4), group 1 (4) killed on both attempts (8); the lost try's agents
    # died by their own signal, not the injector's.
    always = [f"{run_id}-s{s}-g{g}-r{k}" for s, g in ((1, 1), (2, 4)) for k in range(4)]
    assert sorted(killed) == sorted([*kill_once, *always * 2])
    assert "step 2: all 12 rollouts were lost to the infrastructure" in run.output
    assert run.step(1)["agl/step/redone"] == 0.0 and run.step(1)["agl/step/lost_rollouts"] == 0.0
    assert run.step(2)["agl/step/redone"] == 1.0 and run.step(2)["agl/step/lost_rollouts"] == 12.0

    step = run.step(1)
    for redone in (run.step(2),):  # the redo trains as the first step did
        for name in (
            "agl/rollout/failed",
            "agl/rollout/succeeded",
            "agl/infra/killed",
            "agl/infra/dropped_rollouts",
            "agl/infra/dropped_groups",
            "agl/infra/retried_attempts",
            "agl/data/rollouts_trained",
        ):
            assert redone[name] == step[name], name
    # The lost try is in the trajectory log as such, each rollout killed on both of its attempts; nothing of it
    # trained.
    records = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    lost_records = [r for r in records if r.get("kind") == "lost"]
    assert sorted(r["rollout_id"] for r in lost_records) == sorted(f"{p}r{k}" for p in lost for k in range(4))
    assert {(r["step"], r["failure_reason"]) for r in lost_records} == {(2, "KILLED")}
    assert step["agl/rollout/failed"] == 4.0 and step["agl/rollout/succeeded"] == 8.0
    assert step["agl/infra/killed"] == 4.0 and step["agl/infra/lost"] == 0.0
    assert step["agl/infra/dropped_rollouts"] == 4.0 and step["agl/infra/dropped_groups"] == 1.0
    assert step["agl/infra/retried_attempts"] == 8.0  # both groups' four rollouts had a second attempt
    assert step["agl/health/infra_failed_rollouts"] == pytest.approx(1 / 3)
    # The data path saw the eight rollouts of groups 0 and 2 only, and trained on them.
    assert step["agl/data/rollouts"] == 8.0 and step["agl/data/rollouts_trained"] == 8.0
    assert step["agl/update/skipped_no_signal"] == 0.0

    async def records() -> dict[str, dict]:
        async with stack.client() as client:
            found = {}
            for rid in (f"{run_id}-s1-g0-r0", f"{run_id}-s1-g1-r0", f"{run_id}-s1-g2-r0"):
                [event] = await client.list_events(rid, event_type="agl_training_rows")
                found[rid] = json.loads(event.data_json)
            return found

    by_id = asyncio.run(records())
    retried, dropped, clean = by_id.values()
    assert retried["kept"] and retried["rows"] and retried["rows"][0]["trained"]
    assert not dropped["kept"] and dropped["rows"] == [] and dropped["advantage"] is None
    assert dropped["left_out"] == "an infrastructure failure (KILLED), policy drop_rollout"
    assert "infra_failed_rollouts" in dropped["flags"]
    row = clean["rows"][0]
    assert row["trained"] and row["trainer_logprobs"] is not None and len(row["tokens"]) == len(row["mask"])
    # The engine sampled what the trainer recomputes (fp32 on CPU): the same log-probs on the sampled tokens.
    gaps = [
        abs(e - t) for e, t, m in zip(row["engine_logprobs"], row["trainer_logprobs"], row["mask"], strict=True) if m
    ]
    assert gaps and max(gaps) < 1e-3
