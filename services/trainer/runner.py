"""The Ray side of the entrypoint: verl's task runner, building an AglPPOTrainer instead of its own.

`run(config)` is what `agl-trainer` / `python -m services.trainer` calls after Hydra. On a GPU machine it is
verl's own launch. With `trainer.device=cpu` (`placement=cpu`) the same trainer runs verl's
actor on CPU: the runner declares one logical Ray "GPU" per CPU training rank and hands every Ray process
the environment that loads services.trainer.cpu_platform.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import ray
from omegaconf import OmegaConf, open_dict
from verl.trainer.main_ppo import run_ppo
from verl.trainer.main_ppo_v0 import BaseTaskRunner
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import omega_conf_to_dataclass, validate_config

from . import interruption
from .config import ConfigError, TrainerSettings, settings_from_config
from .datasets import load_samples
from .fate import share_fate
from .preflight import check_config

log = logging.getLogger(__name__)


@ray.remote(num_cpus=1)
class AglTaskRunner(BaseTaskRunner):
    def run(self, config: Any) -> None:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        from .ppo_trainer import AglPPOTrainer

        OmegaConf.resolve(config)
        settings = settings_from_config(config)
        log.info("AGL trainer %r", settings)
        _, worker_group_cls = self.add_actor_rollout_worker(config)
        external = bool(config.agl.engines.external)
        if external:
            from .lora_worker import AglActorRolloutRefWorker

            # The same role verl chose (a fused reference policy or not), with the adapter-writing weight update.
            for role in list(self.role_worker_mapping):
                self.role_worker_mapping[role] = ray.remote(AglActorRolloutRefWorker)
        self.add_critic_worker(config)
        self.add_reward_model_resource_pool(config)
        self.add_teacher_model_resource_pool(config)
        validate_config(
            config=without_colocated_lora_check(config) if external else config,
            use_reference_policy=need_reference_policy(config),
            use_critic=need_critic(config),
        )
        model_config = omega_conf_to_dataclass(config.actor_rollout_ref.model)
        train = load_samples(config.data.train_files, int(config.data.get("train_max_samples", -1) or -1))
        val_files = config.data.get("val_files")
        val = load_samples(val_files) if val_files else []
        trainer = AglPPOTrainer(
            config=config,
            tokenizer=model_config.tokenizer,
            role_worker_mapping=self.role_worker_mapping,
            resource_pool_manager=self.init_resource_pool_mgr(config),
            ray_worker_group_cls=worker_group_cls,
            settings=settings,
            train_samples=train,
            val_samples=val,
            processor=model_config.processor,
            device_name=config.trainer.device,
        )
        trainer.init_workers()
        trainer.fit()


def without_colocated_lora_check(config: Any) -> Any:
    """A copy of the config for verl's validate_config that skips its LoRA rank check: that check imports verl's
    colocated vLLM rollout (absent where the engines are external) to round the rank for the replicas verl
    starts; an external engine checks an adapter's rank itself when it loads it (--max-lora-rank)."""
    copy = OmegaConf.create(OmegaConf.to_container(config, resolve=False))
    with open_dict(copy):
        copy.actor_rollout_ref.model.lora_rank = 0
        if copy.actor_rollout_ref.model.get("lora"):
            copy.actor_rollout_ref.model.lora.rank = 0
    return copy


def gpu_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def prepare_cpu(config: Any, joining: bool) -> None:
    """Ray init arguments and the worker environment for a CPU run (in place); `joining`: ray.init connects to a
    running cluster (joins_running_cluster)."""
    from .cpu_platform import cpu_env

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
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    ray_init = OmegaConf.to_container(config.ray_kwargs.ray_init, resolve=True)
    runtime_env = OmegaConf.merge(get_ppo_ray_runtime_env(config), ray_init.pop("runtime_env", None) or {})
    ray.init(**ray_init, runtime_env=OmegaConf.to_container(runtime_env))
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

    from .engine_push import EnginePushError, registered_endpoints

    async def check() -> None:
        async with LedgerClient(settings.ledger_address, settings.key) as client:
            await registered_endpoints(client, settings.model_name)

    try:
        asyncio.run(check())
    except EnginePushError as err:
        raise ConfigError(str(err)) from None
    except LedgerError as err:
        raise ConfigError(f"ledger {settings.ledger_address}: {err.code().name}: {err.details()}") from None


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
    checkpoints = config.trainer.default_local_dir
    interruption.on_signals(settings, checkpoints)
    if joining:
        join_cluster(config)
    else:
        # The cluster ray.init starts is this driver's: it goes when the driver goes (services/trainer/fate.py).
        share_fate()
    # ray.init sets its own SIGTERM handler (sys.exit, which Ray's ray.get turns into a SystemError and a stack
    # dump): ours go back in once it has run, whether joining above or inside verl's run_ppo.
    with interruption.after_ray_init(settings, checkpoints):
        run_ppo(config, task_runner_class=AglTaskRunner)
