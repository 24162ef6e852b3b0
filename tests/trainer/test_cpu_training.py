"""The real trainer step on CPU, end to end: `agl-trainer placement=cpu` (verl's actor worker, FSDP2 over
gloo) against the real ledger, proxy and controller (local processes, auth on) and the real CPU vLLM engine.

Each run is the installed console script, as a user starts it. Agents are real processes: tests.trainer.agents.
"""

from __future__ import annotations

import asyncio
import collections
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from services._gen.agl.v1 import run_pb2
from services.stack import local_stack
from services.trainer.run.engine_push import EnginePushError, push_weights
from tests.support.engine import Engine, chat, reference_logprobs
from tests.trainer import cpu_stack
from tests.trainer.cpu_stack import (
    KEY,
    MODEL,
    TRAINER,
    Stack,
    TrainerRun,
    endpoint_version,
    max_weight_change,
    run_trainer,
    trainer_overrides,
    write_tasks,
)

pytestmark = pytest.mark.trainer


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, cpu_engine: Engine) -> Iterator[Stack]:
    with cpu_stack.start(tmp_path_factory.mktemp("cpu-training"), cpu_engine) as started:
        yield started


async def remaining_by_step(stack: Stack, run_id: str) -> dict[str, int]:
    async with stack.client() as client:
        rollouts = await client.list_rollouts(labels={"agl_run": run_id})
    return dict(collections.Counter(r.metadata.labels.get("agl_step", "") for r in rollouts))


def test_three_steps_train_push_and_clean_up(stack: Stack, cpu_engine: Engine, tmp_path: Path) -> None:
    # Step 1's groups post no reward signal (skipped update); steps 2 and 3 learn, with a KL loss to the start: verl
    # shards that reference apart from the actor, with a pinned-memory offload CPU machines cannot do unpatched.
    tasks = write_tasks(tmp_path / "tasks.jsonl", ["zero", "zero", "parity", "parity", "parity", "parity"])
    kl = ["actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_coef=0.1"]
    run = run_trainer(stack, cpu_engine, "cpu3", tasks, steps=3, lr=1e-3, extra=kl)
    assert run.returncode == 0, run.output[-5000:]
    assert [r["step"] for r in run.metrics if r["step"] > 0] == [1, 2, 3]

    first = run.step(1)
    assert first["agl/update/skipped_no_signal"] == 1.0
    assert "actor/pg_loss" not in first
    for n in (2, 3):
        step = run.step(n)
        assert step["agl/update/skipped_no_signal"] == 0.0
        assert "actor/pg_loss" in step and "actor/grad_norm" in step
        assert "actor/kl_loss" in step
        assert step["agl/push/engines"] == 1.0
        # The rows of each step were sampled by the engine after the last push: same weights, same log-probs.
        assert step["agl/push/logprob_diff_max"] < 1e-4, step
        assert step["agl/rollout/succeeded"] == 8.0

    assert max_weight_change(cpu_engine.model_dir, run.weights_dir) > 0.0
    assert run.step(3)["actor/kl_loss"] > 0.0  # step 2 moved the actor away from the reference
    # The engine serves the pushed weights: its log-probs equal transformers' on the trainer's file.
    answer = chat(cpu_engine, "hello")
    choice = answer["choices"][0]
    served = [item["logprob"] for item in choice["logprobs"]["content"]]
    expected = reference_logprobs(
        cpu_engine.model_dir, run.weights_dir, answer["prompt_token_ids"], choice["token_ids"]
    )
    assert max(abs(a - b) for a, b in zip(served, expected, strict=True)) < 1e-4

    assert asyncio.run(endpoint_version(stack)) == 3
    # Retention (agl.retention.keep_steps, default 2): steps 2 and 3 stay inspectable, step 1's rollouts are deleted.
    assert asyncio.run(remaining_by_step(stack, "cpu3")) == {"2": 8, "3": 8}
    records = [json.loads(line) for line in run.trajectories.read_text().splitlines()]
    assert len(records) == 24
    assert all(r["calls"] and r["calls"][0]["response_tokens"] > 0 for r in records)


def test_zero_learning_rate_leaves_the_weights(stack: Stack, cpu_engine: Engine, tmp_path: Path) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", ["parity"] * 4)
    run = run_trainer(stack, cpu_engine, "cpulr0", tasks, steps=2, lr=0.0)
    assert run.returncode == 0, run.output[-5000:]
    # Both steps update (the agent's tie-break gives every group a signal), with a zero learning rate.
    steps = [run.step(n) for n in (1, 2)]
    assert all("actor/pg_loss" in step and step["agl/update/skipped_no_signal"] == 0.0 for step in steps), steps
    assert max_weight_change(cpu_engine.model_dir, run.weights_dir) == 0.0


def test_no_engine_registered_is_one_clear_error(stack: Stack, cpu_engine: Engine, tmp_path: Path) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", ["parity"] * 2)
    run = run_trainer(stack, cpu_engine, "cpunone", tasks, steps=1, lr=1e-3, model="nobody-serves-this")
    assert run.returncode != 0
    last = run.output.strip().splitlines()[-1]
    assert "no engine is registered for model 'nobody-serves-this'" in last
    assert "Traceback" not in run.output


def test_an_engine_refusing_the_reload_fails_with_its_message(stack: Stack, cpu_engine: Engine, tmp_path: Path) -> None:
    async def push() -> None:
        async with stack.client() as client:
            await push_weights(client, MODEL, tmp_path / "no-such-weights", version=99)

    with pytest.raises(EnginePushError) as refused:
        asyncio.run(push())
    assert cpu_engine.url in str(refused.value)
    assert "no-such-weights" in str(refused.value)
    # Nothing recorded: the registry does not claim a version the engine never loaded.
    assert asyncio.run(endpoint_version(stack)) != 99


def test_cpu_machine_asked_for_gpus_gets_one_line() -> None:
    proc = subprocess.run(
        [str(TRAINER), "agl.launch.agent_class=x:Y"], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert "no GPU is visible" in last and "placement=cpu" in last, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_installed_command_composes_the_cpu_placement() -> None:
    proc = subprocess.run(
        [str(TRAINER), "--cfg", "job", "placement=cpu", "agl.launch.agent_class=x:Y"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    import yaml

    config = yaml.safe_load(proc.stdout)
    assert config["trainer"]["device"] == "cpu"
    assert config["agl"]["engines"]["external"] is True
    assert config["actor_rollout_ref"]["rollout"]["checkpoint_engine"]["backend"] == "agl_file"
    assert config["actor_rollout_ref"]["actor"]["fsdp_config"]["mixed_precision"]["param_dtype"] == "fp32"


def test_val_only_validates_without_training_and_lifts_a_stale_pause(
    stack: Stack, cpu_engine: Engine, tmp_path: Path
) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", ["parity"] * 4)
    # A pause an interrupted trainer left behind (durable in the ledger): the new run must not inherit it.
    asyncio.run(_pause(stack))
    out = tmp_path / "val-only"
    out.mkdir()
    cpu_engine.restore_base_weights()
    argv = [str(TRAINER), f"agl.ledger_address={stack.ledger}", f"agl.key={KEY}"]
    argv += trainer_overrides(cpu_engine, "cpuval", tasks, out, steps=3, lr=1e-3)
    argv += [f"data.val_files={tasks}", "trainer.val_only=true"]
    env = local_stack.child_environment({"VERL_FILE_LOGGER_PATH": str(out / "metrics.jsonl")})
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900, check=False)
    run = TrainerRun.read(proc.returncode, proc.stdout + proc.stderr, out)
    assert run.returncode == 0, run.output[-5000:]
    assert [r["step"] for r in run.metrics] == [0]
    assert run.step(0)["val/agl/reward_mean"] >= 0.0
    assert not any(key.startswith("actor/") for key in run.step(0))
    assert asyncio.run(remaining_by_step(stack, "cpuval")).get("1") is None  # no training rollout was created
    assert max_weight_change(cpu_engine.model_dir, run.weights_dir) == 0.0

    async def state() -> tuple[bool, int]:
        async with stack.client() as client:
            control = await client.get_proxy_control()
            run_record = await client.get_run("cpuval")
        return control.paused, run_record.state

    assert asyncio.run(state()) == (False, run_pb2.RUN_STATE_SUCCEEDED)


async def _pause(stack: Stack) -> None:
    async with stack.client() as client:
        await client.set_proxy_pause(True, 5, "step 7 weight update")
