"""A GPU job submitted to a cluster whose head has no GPU (`ray job submit` runs the driver there) and whose
workers do: the driver must not refuse for want of a local GPU; the cluster's GPUs are what count.

A real two-node Ray cluster on this machine: a head started with `--num-gpus=0` and a second raylet joined with
`ray start --address` declaring one (logical) GPU, as a GPU worker node reports its GPUs to the cluster.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from services.trainer.config import CONFIG_DIR, CONFIG_NAME, ConfigError
from tests.support.procs import free_port

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # verl's and Ray's import-time deprecation warnings
    import ray

    from services.trainer.runner import check_device, join_cluster, joins_running_cluster

pytestmark = [pytest.mark.trainer, pytest.mark.timeout(240)]

RAY = Path(sys.executable).with_name("ray")
RUNNABLE = ("agl.launch.agent_class=examples.math_agent.agent:MathAgent", "data.train_files=/srv/tasks.jsonl")


def _node(env: dict[str, str], log: Path, *args: str) -> subprocess.Popen[bytes]:
    """`ray start --block` in its own process group: teardown ends this node's processes and no one else's."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [str(RAY), "start", "--block", *args], env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def _wait_gpus(address: str, nodes: list[subprocess.Popen[bytes]], logs: list[Path]) -> None:
    """Until both nodes are in the cluster (the worker's GPU counted)."""
    deadline = time.monotonic() + 120
    ray.init(address=address, logging_level="ERROR")
    try:
        while ray.cluster_resources().get("GPU", 0) < 1:
            if time.monotonic() > deadline or any(node.poll() is not None for node in nodes):
                pytest.fail("the two-node cluster did not come up:\n" + "\n".join(p.read_text()[-1500:] for p in logs))
            time.sleep(0.5)
    finally:
        ray.shutdown()


@pytest.fixture
def cpu_head_with_gpu_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    # Short temp dir: Ray's socket paths must stay under the unix socket limit.
    temp = Path("/tmp") / f"agl-ray-{os.getpid()}"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    address = f"127.0.0.1:{free_port()}"
    logs = [tmp_path / "head.log", tmp_path / "worker.log"]
    nodes = [
        _node(env, logs[0], "--head", f"--port={address.split(':')[1]}", "--num-gpus=0", "--num-cpus=4",
              f"--temp-dir={temp}", "--include-dashboard=false", "--disable-usage-stats"),
    ]  # fmt: skip
    try:
        time.sleep(3)
        nodes.append(_node(env, logs[1], f"--address={address}", "--num-gpus=1", "--num-cpus=4"))
        _wait_gpus(address, nodes, logs)
        monkeypatch.setenv("RAY_ADDRESS", address)
        yield address
    finally:
        if ray.is_initialized():
            ray.shutdown()
        for node in reversed(nodes):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.pid, signal.SIGTERM)
        for node in reversed(nodes):
            try:
                node.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(node.pid, signal.SIGKILL)
                node.wait()


def _config(*overrides: str):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(config_name=CONFIG_NAME, overrides=[*RUNNABLE, *overrides])


def test_a_gpu_job_on_a_cpu_head_with_gpu_workers_passes_and_too_many_ranks_are_refused(
    cpu_head_with_gpu_worker: str,
) -> None:
    import torch

    assert not torch.cuda.is_available()  # the driver's machine, like the head, has no GPU
    config = _config()
    joining = joins_running_cluster(config.ray_kwargs.ray_init.get("address"))
    assert joining
    check_device(config, joining)
    join_cluster(config)
    assert ray.cluster_resources().get("GPU") == 1.0
    ray.shutdown()
    with pytest.raises(ConfigError, match=r"the Ray cluster has 1 GPU .* 2 training rank\(s\) need 2 GPU"):
        join_cluster(_config("trainer.n_gpus_per_node=2", "data.train_batch_size=8"))


def test_a_gpu_job_with_no_cluster_and_no_gpu_is_refused_here(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    config = _config()
    with pytest.raises(ConfigError, match="no GPU is visible here"):
        check_device(config, joining=False)
