"""Training without a GPU through the compose file, for real: `docker-compose` (against podman's Docker API) brings up
profiles `engine` and `ray-cpu` (ledger, proxy, controller, the CPU vLLM engine registered as the model's endpoint,
a Ray head from the trainer's CPU image), then `ray job submit` runs `agl-trainer placement=cpu` in that head for
two steps of the unmodified math agent. The agents run in the controller's container, the weights go through the
`engine-weights` volume from the head to the engine, and the engine serves them.

It needs the agl-engine image (vLLM's CPU build, ~4 GB), which CI does not build: the marker `engine_image` keeps
it out of the default run (pyproject's addopts). Run it with `make compose-cpu-training-test` (builds every CPU
image first).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from deploy import podman_harness
from deploy.podman_harness import ComposeProject, Podman
from services.client import LedgerClient
from tests.support.containers import RAY, ray_job_status
from tests.support.procs import free_port
from tools import demo_train

pytestmark = [pytest.mark.containers, pytest.mark.engine_image, pytest.mark.timeout(3600)]

KEY = "compose-cpu-training-key"
MODEL = "agl-policy"
IMAGES = ("agl-ledger", "agl-proxy", "agl-controller-local", "agl-trainer-cpu", "agl-engine")
HEALTHY = ("ledger", "proxy", "engine", "ray-head-cpu")
STEPS = 3


@dataclass
class Stack:
    project: ComposeProject
    ledger: str
    dashboard: str
    weights_volume: Path
    tasks: list[dict]


@pytest.fixture(scope="module")
def built(podman: Podman) -> dict[str, float]:
    return podman_harness.build(podman, IMAGES)


@pytest.fixture(scope="module")
def stack(
    podman: Podman, built: dict[str, float], docker_host: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    # The demo's warm-started model on the demo's tasks: it answers about one in ten, so groups of 4 rollouts have
    # a reward signal to learn from (a random model scores 0 everywhere and every update is skipped).
    data = tmp_path_factory.mktemp("compose-cpu")
    task_args = argparse.Namespace(train_tasks=64, val_tasks=8, max_operand=19)
    _, _, train = demo_train.prepare_tasks(data, task_args)
    held_out = demo_train.start_held_out(task_args, demo_train.AGENTS["math"])
    model = demo_train.prepare_model(data / "models", train, 100, sys.stdout, held_out=held_out, refuse=False)
    ledger_port, proxy_port, dashboard_port = free_port(), free_port(), free_port()
    variables = {
        "AGL_KEY": KEY,
        "AGL_MODEL_NAME": MODEL,
        "AGL_ENGINE_MODEL_HOST_DIR": str(model),
        "AGL_LEDGER_PUBLISH_PORT": f"127.0.0.1:{ledger_port}",
        "AGL_PROXY_PUBLISH_PORT": f"127.0.0.1:{proxy_port}",
        "AGL_RAY_DASHBOARD_PUBLISH_PORT": f"127.0.0.1:{dashboard_port}",
    }
    project = ComposeProject(podman, docker_host, f"aglcpu{os.getpid()}", variables, ["engine", "ray-cpu"])
    try:
        project.up()
        _wait(project, timeout_s=400)
        mountpoint = podman.run("volume", "inspect", "--format", "{{.Mountpoint}}", f"{project.name}_engine-weights")
        volume = Path(mountpoint.stdout.strip())
        yield Stack(project, f"127.0.0.1:{ledger_port}", f"http://127.0.0.1:{dashboard_port}", volume, train)
    finally:
        project.down(volumes=True)


def _wait(project: ComposeProject, timeout_s: float) -> None:
    """Every service with a health check healthy, then the one-shot registration done."""
    states = project.wait_healthy(HEALTHY, timeout_s)
    deadline = time.monotonic() + 60
    while (states.get("register-engine") or {}).get("Status") != "exited":
        if time.monotonic() > deadline:
            pytest.fail(f"register-engine did not finish: {states.get('register-engine')}\n{project.logs()}")
        time.sleep(1)
        states = project.containers()
    assert states["register-engine"]["ExitCode"] == 0, project.logs()


async def _endpoints(stack: Stack) -> list:
    async with LedgerClient(stack.ledger, key=KEY) as client:
        return list(await client.list_models(MODEL))


def test_ray_job_on_the_compose_stack_trains_the_math_agent_and_the_engine_takes_the_weights(
    stack: Stack, tmp_path: Path
) -> None:
    (before,) = asyncio.run(_endpoints(stack))
    assert before.endpoint == "http://engine:8000/v1"
    workdir = tmp_path / "job"
    workdir.mkdir()
    (workdir / "tasks.jsonl").write_text("".join(json.dumps(task) + "\n" for task in stack.tasks))
    submission = f"agl-compose-cpu-{os.getpid()}"
    # verl's file logger writes into the shared volume, where this test reads it.
    runtime_env = {"env_vars": {"VERL_FILE_LOGGER_PATH": "/weights/metrics.jsonl"}}
    argv = [
        str(RAY), "job", "submit", "--address", stack.dashboard, "--submission-id", submission,
        "--working-dir", str(workdir), "--runtime-env-json", json.dumps(runtime_env), "--",
        "agl-trainer", "placement=cpu", "agl.run_id=compose-cpu",
        "agl.launch.agent_class=examples.math_agent.agent:MathAgent",
        "+agl.launch.env_map.AGL_TASK_QUESTION=input.question", "+agl.launch.env_map.AGL_TASK_ANSWER=input.answer",
        "agl.launch.timeout_seconds=120", "agl.progress=false", "data.train_files=tasks.jsonl", "data.shuffle=false",
        "data.train_batch_size=8", "data.max_prompt_length=64", "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.rollout.response_length=16", "actor_rollout_ref.model.path=/model",
        "actor_rollout_ref.actor.optim.lr=1e-4", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        f"trainer.total_training_steps={STEPS}", "trainer.save_freq=-1", "trainer.test_freq=-1",
        "trainer.logger=[console,file]",
    ]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1800, check=False)
    output = proc.stdout + proc.stderr
    status = ray_job_status(stack.dashboard, submission)
    assert status == "SUCCEEDED", f"job {status}:\n{output[-6000:]}\n{stack.project.logs()}"

    records = [json.loads(line) for line in (stack.weights_volume / "metrics.jsonl").read_text().splitlines()]
    steps = {r["step"]: r["data"] for r in records if r["step"] > 0}
    assert sorted(steps) == list(range(1, STEPS + 1)), output[-3000:]
    # Every rollout ran the math agent in the controller's container and ended.
    assert all(data["agl/rollout/succeeded"] == 32.0 for data in steps.values()), steps
    # A step whose groups all scored alike is skipped (nothing to learn, nothing pushed); at ~1 in 10 right, a
    # step of 8 groups has none with a signal 3% of the time.
    updated = [n for n, data in steps.items() if "actor/pg_loss" in data]
    assert updated, steps
    for n in updated:
        assert steps[n]["agl/push/engines"] == 1.0, steps[n]
        # The rows were sampled by the engine after the last push: it serves the weights from the volume.
        assert steps[n]["agl/push/logprob_diff_max"] < 1e-4, steps[n]
    assert any(path.suffix == ".safetensors" for path in stack.weights_volume.rglob("*")), "no weights in the volume"
    (after,) = asyncio.run(_endpoints(stack))
    assert after.version == before.version + len(updated)
