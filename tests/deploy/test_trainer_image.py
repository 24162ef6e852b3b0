"""The trainer image for real, in its CPU variant: built from deploy/docker/trainer.Dockerfile with the build
arguments its header gives, a Ray head started from it as the compose file's `ray-head` service starts one, and a
training job submitted to that head with `ray job submit`, as docs/training/ray.md says. The job trains two steps
against the real ledger, proxy and controller (local processes, auth on) and the real CPU vLLM engine, and its
weights reach the engine.

The Dockerfile's default variant (PyPI's CUDA torch and vLLM, several GB) is not built here: CI must not download
CUDA. Both variants run the same RUN steps; only the build arguments differ.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from deploy import podman_harness
from deploy.podman_harness import Podman
from tests.deploy.conftest import DEPLOY
from tests.support.containers import RAY, ray_job_status
from tests.support.engine import Engine
from tests.support.procs import free_port
from tests.trainer import cpu_stack
from tests.trainer.cpu_stack import KEY, MODEL, Stack, TrainerRun, endpoint_version, max_weight_change, write_tasks

# The image's build (torch, verl, Ray: minutes) is the first test's setup.
pytestmark = [pytest.mark.containers, pytest.mark.trainer, pytest.mark.timeout(2400)]

IMAGE = podman_harness.IMAGES["agl-trainer-cpu"]


@dataclass
class RayHead:
    container: str
    dashboard: str
    # Bind-mounted at the same path inside: the job writes its weights there and the engine (on the host) reads them.
    shared: Path


@pytest.fixture(scope="module")
def built(podman: Podman) -> dict[str, float]:
    return podman_harness.build(podman, [IMAGE.name])


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, cpu_engine: Engine) -> Iterator[Stack]:
    with cpu_stack.start(tmp_path_factory.mktemp("trainer-image"), cpu_engine) as started:
        yield started


def _ray_head_service() -> dict:
    return yaml.safe_load((DEPLOY / "docker-compose.yaml").read_text())["services"]["ray-head-cpu"]


@pytest.fixture(scope="module")
def ray_head(podman: Podman, built: dict[str, float], stack: Stack, cpu_engine: Engine) -> Iterator[RayHead]:
    service = _ray_head_service()
    shared = stack.root / "shared"
    shared.mkdir()
    # The image runs as uid 10001.
    shared.chmod(0o777)
    # The image runs as uid 10001: services.engine.tiny_model leaves the model's files readable by others.
    assert all(path.stat().st_mode & 0o004 for path in cpu_engine.model_dir.iterdir())
    gcs, dashboard = free_port(), free_port()
    name = f"agl-ray-head-{os.getpid()}"
    # The compose service's command, on this host's network (the job reaches the local ledger and engine on
    # loopback) with free ports.
    command = [arg for arg in service["command"] if not arg.startswith(("--port=", "--dashboard-"))]
    command += [
        f"--port={gcs}",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={dashboard}",
        f"--dashboard-agent-listen-port={free_port()}",
        f"--ray-client-server-port={free_port()}",
    ]
    environment = {**service["environment"], "AGL_LEDGER_ADDR": stack.ledger, "AGL_KEY": KEY, "AGL_MODEL_NAME": MODEL}
    env_args = [arg for key, value in environment.items() for arg in ("--env", f"{key}={value}")]
    podman.run("rm", "--force", name, check=False)
    podman.run(
        "run", "--detach", "--name", name, "--network", "host", "--shm-size", "1g", *env_args,
        "--volume", f"{shared}:{shared}",
        "--volume", f"{cpu_engine.model_dir}:{cpu_engine.model_dir}:ro",
        "--entrypoint", service["entrypoint"][0], IMAGE.tag, *command,
    )  # fmt: skip
    try:
        _wait_ray_healthy(podman, name, service["healthcheck"]["test"][1:])
        yield RayHead(name, f"http://127.0.0.1:{dashboard}", shared)
    finally:
        podman.run("rm", "--force", "--time", "10", name, check=False, timeout=120)


def _wait_ray_healthy(podman: Podman, container: str, check: list[str], timeout_s: float = 120) -> None:
    """The compose file's health check (`ray status`) run in the container, until it passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = podman.run("exec", container, *check, check=False, timeout=60)
        if result.returncode == 0:
            return
        state = podman.inspect(container)["State"]
        if not state.get("Running") or time.monotonic() > deadline:
            logs = podman.run("logs", "--tail", "60", container, check=False)
            pytest.fail(f"the Ray head is not healthy: {result.stderr[-2000:]}\n{logs.stdout}{logs.stderr}")
        time.sleep(2)


def _python_in_image(podman: Podman, code: str) -> dict:
    result = podman.run("run", "--rm", "--entrypoint", "python", IMAGE.tag, "-c", code, timeout=300)
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_cpu_image_has_cpu_torch_verl_ray_and_no_vllm(podman: Podman, built: dict[str, float]) -> None:
    config = podman.inspect(IMAGE.tag)["Config"]
    assert config["User"] == "10001:10001"
    assert config["Entrypoint"] == ["agl-trainer"]
    found = _python_in_image(
        podman,
        "import importlib.metadata as m, importlib.util as u, json, os, torch;"
        "print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda, 'verl': m.version('verl'),"
        " 'ray': m.version('ray'), 'vllm': u.find_spec('vllm') is not None, 'uid': os.getuid(),"
        " 'dashboard': u.find_spec('ray.dashboard') is not None}))",
    )
    assert found["torch"] == "2.13.0+cpu" and found["cuda"] is None, found
    assert found["verl"] == "0.9.1" and found["dashboard"], found
    assert not found["vllm"], found
    assert found["uid"] == 10001
    from importlib.metadata import version

    # `ray job submit` from this checkout's venv talks to the image's job server: the same Ray release.
    assert found["ray"] == version("ray"), found


def test_the_image_has_what_the_gpu_smoke_and_a_compiled_kernel_need(podman: Podman, built: dict[str, float]) -> None:
    # The whole loop's imports (the ledger's grpc_reflection among them) and tools/ + deploy/: gpu_smoke's imports
    # run before its argument parser, so --help exits 0 only when all of them resolve.
    smoke = podman.run(
        "run", "--rm", "--entrypoint", "python", IMAGE.tag, "tools/gpu_smoke.py", "--help", check=False, timeout=300
    )
    assert smoke.returncode == 0, smoke.stderr[-2000:]
    assert "usage: gpu_smoke.py" in smoke.stdout
    found = _python_in_image(
        podman,
        "import importlib.util as u, json, shutil;"
        "import services.ledger.server, services.proxy.app, services.controller.core.controller;"
        "print(json.dumps({'reflection': u.find_spec('grpc_reflection') is not None, 'cc': shutil.which('gcc')}))",
    )
    assert found["reflection"], found
    assert found["cc"], found  # triton's launcher build finds a compiler
    # And it links: a C file to a shared object, as triton builds its launcher.
    compile_ = podman.run(
        "run", "--rm", "--entrypoint", "sh", IMAGE.tag, "-c",
        "cd /tmp && printf 'int f(void){return 1;}' > k.c && gcc -shared -fPIC -o k.so k.c && test -s k.so",
        check=False, timeout=120,
    )  # fmt: skip
    assert compile_.returncode == 0, compile_.stderr[-2000:]


def test_the_compose_service_and_the_harness_build_the_same_cpu_variant() -> None:
    build = _ray_head_service()["build"]
    assert build["dockerfile"] == f"deploy/docker/{IMAGE.dockerfile}"
    assert build["args"] == dict(podman_harness.TRAINER_CPU_ARGS)
    # The Dockerfile's header tells a Docker user the same arguments.
    header = (DEPLOY / "docker" / IMAGE.dockerfile).read_text()
    for name, value in podman_harness.TRAINER_CPU_ARGS:
        assert f"--build-arg {name}={value}" in header, name


def test_cpu_image_composes_the_cpu_placement(podman: Podman, built: dict[str, float]) -> None:
    result = podman.run("run", "--rm", IMAGE.tag, "--cfg", "job", "placement=cpu", "agl.launch.agent_class=x:Y")
    config = yaml.safe_load(result.stdout)
    assert config["trainer"]["device"] == "cpu"
    assert config["agl"]["engines"]["external"] is True


def test_ray_job_submitted_to_the_image_trains_and_pushes_to_the_engine(
    stack: Stack, ray_head: RayHead, cpu_engine: Engine
) -> None:
    run_id = "image2"
    out = ray_head.shared / run_id
    out.mkdir()
    out.chmod(0o777)
    # The job's working directory, shipped by Ray as the documented `--working-dir .` ships the checkout.
    workdir = stack.root / "job"
    workdir.mkdir()
    write_tasks(workdir / "tasks.jsonl", ["parity"] * 4)
    submission = f"agl-image-{os.getpid()}"
    overrides = cpu_stack.trainer_overrides(cpu_engine, run_id, "tasks.jsonl", out, steps=2, lr=1e-3)
    runtime_env = {"env_vars": {"VERL_FILE_LOGGER_PATH": str(out / "metrics.jsonl")}}
    argv = [
        str(RAY), "job", "submit", "--address", ray_head.dashboard, "--submission-id", submission,
        "--working-dir", str(workdir), "--runtime-env-json", json.dumps(runtime_env), "--",
        "agl-trainer", *overrides,
    ]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1200, check=False)
    output = proc.stdout + proc.stderr
    status = ray_job_status(ray_head.dashboard, submission)
    assert status == "SUCCEEDED", f"job {status}, `ray job submit` exited {proc.returncode}:\n{output[-6000:]}"
    assert proc.returncode == 0, output[-3000:]

    run = TrainerRun.read(proc.returncode, output, out)
    assert [r["step"] for r in run.metrics if r["step"] > 0] == [1, 2], output[-3000:]
    for n in (1, 2):
        step = run.step(n)
        assert "actor/pg_loss" in step and step["agl/push/engines"] == 1.0, step
        assert step["agl/rollout/succeeded"] == 8.0
        # The rows were sampled with the weights the job pushed last: the engine's log-probs equal the trainer's.
        assert step["agl/push/logprob_diff_max"] < 1e-4, step
    assert max_weight_change(cpu_engine.model_dir, run.weights_dir) > 0.0
    assert asyncio.run(endpoint_version(stack)) == 2


def test_a_job_asking_more_ranks_than_the_head_declares_stops_with_one_line(
    stack: Stack, ray_head: RayHead, cpu_engine: Engine
) -> None:
    out = ray_head.shared / "image-short"
    out.mkdir()
    out.chmod(0o777)
    tasks = write_tasks(out / "tasks.jsonl", ["parity"] * 2)
    overrides = cpu_stack.trainer_overrides(cpu_engine, "image-short", tasks, out, steps=1, lr=1e-3)
    submission = f"agl-image-short-{os.getpid()}"
    argv = [
        str(RAY), "job", "submit", "--address", ray_head.dashboard, "--submission-id", submission, "--",
        "agl-trainer", *overrides, "trainer.n_gpus_per_node=2",
    ]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    assert ray_job_status(ray_head.dashboard, submission) == "FAILED"
    output = proc.stdout + proc.stderr
    assert "the Ray cluster has 1 GPU and 8 CPU, and 2 training rank(s) need 2 GPU and 7 CPU" in output, output[-3000:]
    assert "ray start --head --num-gpus=2 --num-cpus=8" in output
    assert "Traceback" not in output
