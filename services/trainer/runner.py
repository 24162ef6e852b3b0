"""The Ray side of the entrypoint: verl's task runner in a Ray actor, building an AglPPOTrainer instead of its own.

`run(config)` is what `agl-trainer` / `python -m services.trainer` calls after Hydra. On a GPU machine it is
verl's own launch. With `trainer.device=cpu` (`placement=cpu`) the same trainer runs verl's
actor on CPU: the runner declares one logical Ray "GPU" per CPU training rank and hands every Ray process
the environment that loads services.trainer.verl.cpu_platform.

The driver imports no verl (ray_env.py says why): the task runner's body is verl/task_runner.py, imported inside
the actor.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any

import ray
from omegaconf import OmegaConf, open_dict

from services.trainer import interruption
from services.trainer.config import ConfigError, TrainerSettings, settings_from_config
from services.trainer.preflight import check_config
from services.trainer.ray_env import cpu_env, ray_init_kwargs, set_run_switches
from services.trainer.run.fate import kill_failed_start, share_fate

log = logging.getLogger(__name__)


@ray.remote(num_cpus=1)
class AglTaskRunner:
    def run(self, config: Any) -> None:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        from services.trainer.verl.task_runner import TaskRunner

        TaskRunner().run(config)


# Ray waits a fixed 30 s for its new node to register with its GCS, and a loaded machine can take longer (seen at
# load averages of 15-22 on 2 cores: "The current node timed out during startup"; the same command then worked).
RAY_START_TRIES = 3
_NODE_TIMEOUT = "timed out during startup"


def start_ray(kwargs: dict[str, Any], watchdog: int | None = None) -> None:
    """ray.init, tried again when its node did not register in time; what the failed try started is killed first
    (the fate watchdog spared)."""
    for attempt in range(1, RAY_START_TRIES + 1):
        try:
            ray.init(**kwargs)
            return
        except Exception as err:
            if _NODE_TIMEOUT not in str(err) or attempt == RAY_START_TRIES:
                raise
            log.warning("Ray's node did not start within Ray's 30 s (%s): starting it again (try %d of %d)",
                        err, attempt + 1, RAY_START_TRIES)  # fmt: skip
            with contextlib.suppress(Exception):
                ray.shutdown()
            kill_failed_start(watchdog)


def launch(config: Any, watchdog: int | None = None) -> None:
    """verl's run_ppo with AglTaskRunner: ray.init (unless joined already), then the task runner's run."""
    if not ray.is_initialized():
        start_ray(ray_init_kwargs(config), watchdog)
    runner = AglTaskRunner.remote()
    profiler = config.global_profiler
    if profiler.tool == "nsys" and profiler.get("steps") and str(config.trainer.get("device", "cuda")) != "cpu":
        from verl.utils.device import is_cuda_available

        if is_cuda_available:
            nsight = OmegaConf.to_container(profiler.global_tool_config.nsys.controller_nsight_options)
            runner = AglTaskRunner.options(runtime_env={"nsight": nsight}).remote()
    ray.get(runner.run.remote(config))


def gpu_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def prepare_cpu(config: Any, joining: bool) -> None:
    """Ray init arguments and the worker environment for a CPU run (in place); `joining`: ray.init connects to a
    running cluster (joins_running_cluster)."""
    env = cpu_env()
    os.environ.update(env)
    ranks = int(config.trainer.nnodes) * int(config.trainer.n_gpus_per_node)
    with open_dict(config):
        ray_init = config.ray_kwargs.ray_init
        if joining:
            # A job submitted with `ray job submit`, or a `ray start` cluster on this machine: Ray refuses node
            # resources from a driver that connects, so the cluster declares its logical GPUs and CPUs itself
            # (join_cluster checks them).
            for key in ("num_gpus", "num_cpus", "object_store_memory"):
                ray_init.pop(key, None)
        else:
            # One logical "GPU" per CPU rank: verl's resource pools and placement groups then work unchanged.
            ray_init.num_gpus = ranks
            if ray_init.get("num_cpus") is None:
                ray_init.num_cpus = max(os.cpu_count() or 1, ranks + 4)
            ray_init.include_dashboard = False
            if ray_init.get("object_store_memory") is None:
                ray_init.object_store_memory = 256 * 1024**2
        # The workers' variables go in the runtime env: a cluster started elsewhere (`ray start`, a job's head)
        # does not inherit this process's environment. Assigned, not setdefault: DictConfig.setdefault hands
        # back a detached dict, so what was put in it never reached ray.init.
        if ray_init.get("runtime_env") is None:
            ray_init.runtime_env = {}
        ray_init.runtime_env.env_vars = {**(ray_init.runtime_env.get("env_vars") or {}), **env}


def joins_running_cluster(address: str | None) -> bool:
    """Whether ray.init(address) connects to a running cluster rather than starting one: Ray's own resolution
    (the address, RAY_ADDRESS, then a cluster `ray start` left on this machine)."""
    from ray._private.services import canonicalize_bootstrap_address

    try:
        return canonicalize_bootstrap_address(address) is not None
    except ConnectionError:
        # "auto" with nothing running.
        return False


# CPUs each training rank's placement bundle asks for (verl's ResourcePoolManager.max_colocate_count), and the
# task runner's one.
CPUS_PER_RANK = 3
TASK_RUNNER_CPUS = 1


def join_cluster(config: Any) -> None:
    """Connects to the running cluster as verl would (its runtime env under the config's), then checks that the
    cluster can place the ranks: short of GPUs or CPUs, verl's placement group waits forever and the only sign is
    the autoscaler's log."""
    ray.init(**ray_init_kwargs(config))
    ranks = int(config.trainer.nnodes) * int(config.trainer.n_gpus_per_node)
    have = ray.cluster_resources()
    gpus, cpus = have.get("GPU", 0), have.get("CPU", 0)
    need_cpus = CPUS_PER_RANK * ranks + TASK_RUNNER_CPUS
    if gpus < ranks or cpus < need_cpus:
        raise ConfigError(
            f"the Ray cluster has {gpus:g} GPU and {cpus:g} CPU, and {ranks} training rank(s) need {ranks} GPU and "
            f"{need_cpus} CPU (trainer.nnodes x trainer.n_gpus_per_node = {ranks}); on CPU, start the head with "
            f"`ray start --head --num-gpus={ranks} --num-cpus={max(need_cpus, 8)}` (logical resources)"
        )


def check_device(config: Any, joining: bool) -> None:
    """A GPU run needs a GPU here, unless it joins a running cluster: `ray job submit` runs this on the head, which
    may have none while its workers do; join_cluster then counts the cluster's GPUs (ray.cluster_resources)."""
    device = str(config.trainer.get("device", "cuda"))
    if device == "cpu" or joining:
        return
    if not gpu_available():
        raise ConfigError(
            f"trainer.device={device} but no GPU is visible here: to train on CPU, run "
            f"`agl-trainer placement=cpu ...` (verl's actor on CPU, an external vLLM engine)"
        )


def check_engines(settings: TrainerSettings) -> None:
    """External engines: the ledger must answer and list at least one engine of the model, before Ray starts."""
    if not settings.external_engines:
        return
    import asyncio

    from services.client import LedgerClient, LedgerError
    from services.trainer.run.engine_push import EnginePushError, registered_endpoints

    async def check() -> None:
        async with LedgerClient(settings.ledger_address, settings.key) as client:
            await registered_endpoints(client, settings.model_name)

    try:
        asyncio.run(check())
    except EnginePushError as err:
        raise ConfigError(str(err)) from None
    except LedgerError as err:
        raise ConfigError(f"ledger {settings.ledger_address}: {err.code_name}: {err.details()}") from None


def run(config: Any) -> None:
    """Validates the AGL settings on the driver (fail fast, no GPU needed), then runs the Ray job."""
    settings = settings_from_config(config)
    # Resolved once: it may scan this machine's processes for a running cluster.
    joining = joins_running_cluster(config.ray_kwargs.ray_init.get("address"))
    check_device(config, joining)
    check_config(config)
    check_engines(settings)
    if str(config.trainer.get("device", "cuda")) == "cpu":
        prepare_cpu(config, joining)
    # Before any ray.init (joining or launching): verl's runtime env forwards what these set.
    set_run_switches(config)
    checkpoints = config.trainer.default_local_dir
    interruption.on_signals(settings, checkpoints)
    watchdog = None
    if joining:
        join_cluster(config)
    else:
        # The cluster ray.init starts is this driver's: it goes when the driver goes (services/trainer/run/fate.py).
        started = share_fate()
        watchdog = started.pid if started is not None else None
    # ray.init sets its own SIGTERM handler (sys.exit, which Ray's ray.get turns into a SystemError and a stack
    # dump): ours go back in once it has run, whether joining above or in launch().
    with interruption.after_ray_init(settings, checkpoints):
        launch(config, watchdog)
