"""services.trainer.verl.cpu_platform against the installed verl: the extension points it uses still exist, and
its one patch still matches the function it wraps (the test fails if verl moves; the module pins 0.9.1)."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import warnings

import pytest

pytestmark = pytest.mark.trainer


def test_verl_version_and_patched_function_are_what_the_module_was_written_against() -> None:
    import verl
    import verl.utils.distributed as distributed

    from services.trainer.verl.cpu_platform import VERL_VERSION

    assert verl.__version__ == VERL_VERSION
    original = distributed.initialize_global_process_group_ray
    if getattr(original, "_agl_cpu", False):  # already patched in this process
        return
    assert list(inspect.signature(original).parameters) == ["timeout_second", "backend"]
    # The reason for the patch: without a backend, verl builds "cpu:gloo,{device}:{backend}".
    assert 'f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"' in inspect.getsource(original)


def run_in_cpu_platform(code: str) -> str:
    env = {**os.environ, "VERL_USE_EXTERNAL_MODULES": "services.trainer.verl.cpu_platform", "VERL_PLATFORM": "cpu"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1]


def test_the_platform_is_selected_and_verl_workers_get_gloo_and_the_fsdp_engine() -> None:
    code = (
        "import verl, verl.workers.engine_workers as ew\n"
        "from verl.utils.device import get_device_name, get_nccl_backend\n"
        "from verl.workers.engine.base import EngineRegistry\n"
        "from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead\n"
        "engine = EngineRegistry.get_engine_cls('language_model', 'fsdp2')\n"
        "patched = ew.initialize_global_process_group_ray._agl_cpu\n"
        "print(get_device_name(), get_nccl_backend(), engine is FSDPEngineWithLMHead, patched)\n"
    )
    assert run_in_cpu_platform(code) == "cpu gloo True True"


def test_a_process_group_comes_up_on_gloo() -> None:
    code = (
        "import os\n"
        "os.environ.update(RANK='0', WORLD_SIZE='1', MASTER_ADDR='127.0.0.1', MASTER_PORT='29533')\n"
        "import torch.distributed as dist, verl\n"
        "import verl.workers.engine_workers as ew\n"
        "ew.initialize_global_process_group_ray(timeout_second=60)\n"
        "print(dist.get_backend())\n"
        "dist.destroy_process_group()\n"
    )
    assert run_in_cpu_platform(code) == "gloo"


def test_the_platform_is_never_picked_without_verl_platform() -> None:
    code = "import services.trainer.verl.cpu_platform as p\nprint(p.CpuPlatform().is_platform_available(True))\n"
    env = {k: v for k, v in os.environ.items() if k != "VERL_PLATFORM"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "False"


def _cpu_ray_init(monkeypatch: pytest.MonkeyPatch, ray_address: str | None, address: str | None = None) -> dict:
    from omegaconf import OmegaConf

    from services.trainer.ray_env import cpu_env

    with warnings.catch_warnings():
        # verl's and Ray's import-time deprecation warnings (the suite turns warnings into errors).
        warnings.simplefilter("ignore")
        from services.trainer.runner import joins_running_cluster, prepare_cpu

    if ray_address is None:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
    else:
        monkeypatch.setenv("RAY_ADDRESS", ray_address)
    # prepare_cpu sets the workers' variables in os.environ too: monkeypatch puts them back afterwards.
    for key in cpu_env():
        if key in os.environ:
            monkeypatch.setenv(key, os.environ[key])
        else:
            monkeypatch.delenv(key, raising=False)
    config = OmegaConf.create(
        {"trainer": {"nnodes": 1, "n_gpus_per_node": 2}, "ray_kwargs": {"ray_init": {"num_cpus": None}}}
    )
    if address is not None:
        config.ray_kwargs.ray_init.address = address
    prepare_cpu(config, joins_running_cluster(config.ray_kwargs.ray_init.get("address")))
    return OmegaConf.to_container(config.ray_kwargs.ray_init)


def test_a_local_cpu_run_declares_one_logical_gpu_per_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    ray_init = _cpu_ray_init(monkeypatch, None)
    assert ray_init["num_gpus"] == 2 and ray_init["num_cpus"] >= 6
    assert ray_init["runtime_env"]["env_vars"]


@pytest.mark.parametrize(("ray_address", "address"), [("127.0.0.1:6379", None), (None, "10.1.2.3:6379")])
def test_a_cpu_job_joining_a_cluster_asks_ray_for_no_node_resources(
    monkeypatch: pytest.MonkeyPatch, ray_address: str | None, address: str | None
) -> None:
    # `ray job submit` sets RAY_ADDRESS for the job; Ray refuses num_cpus/num_gpus/object_store_memory from a
    # driver that connects ("When connecting to an existing cluster, num_cpus and num_gpus must not be provided").
    ray_init = _cpu_ray_init(monkeypatch, ray_address, address)
    assert not {"num_gpus", "num_cpus", "object_store_memory"} & set(ray_init), ray_init
    # The workers still get the CPU platform's variables.
    assert ray_init["runtime_env"]["env_vars"]
