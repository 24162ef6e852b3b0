"""A GPU job submitted to a cluster whose head has no GPU (`ray job submit` runs the driver there) and whose
workers do: the driver must not refuse for want of a local GPU; the cluster's GPUs are what count.

A real two-node Ray cluster on this machine: a head started with `--num-gpus=0` and a second raylet joined with
`ray start --address` declaring one (logical) GPU, as a GPU worker node reports its GPUs to the cluster.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from services.trainer.config import CONFIG_DIR, CONFIG_NAME, ConfigError
from tools.multinode_sim import two_node_cluster

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # verl's and Ray's import-time deprecation warnings
    import ray

    from services.trainer.runner import check_device, join_cluster, joins_running_cluster

pytestmark = [pytest.mark.trainer, pytest.mark.timeout(240)]

RUNNABLE = ("agl.launch.agent_class=examples.math_agent.agent:MathAgent", "data.train_files=/srv/tasks.jsonl")


@pytest.fixture
def cpu_head_with_gpu_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    # The simulation's cluster: loopback node addresses, free ports for every raylet service, private temp dirs,
    # and both nodes seen alive before the test goes on (a fixed sleep raced the head's start on a loaded CI).
    with two_node_cluster(tmp_path / "ray", ranks_per_node=1, head_gpus=0) as cluster:
        monkeypatch.setenv("RAY_ADDRESS", cluster.gcs_address)
        try:
            yield cluster.gcs_address
        finally:
            if ray.is_initialized():
                ray.shutdown()


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
