"""The Ray side of the entrypoint: verl's task runner, building an AglPPOTrainer instead of its own.

GPU-only (verl workers, vLLM). `run(config)` is what `python -m services.trainer` calls after Hydra.
"""

from __future__ import annotations

import logging
from typing import Any

import ray
from omegaconf import OmegaConf
from verl.trainer.main_ppo import run_ppo
from verl.trainer.main_ppo_v0 import BaseTaskRunner
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import omega_conf_to_dataclass, validate_config

from .config import settings_from_config
from .datasets import load_samples

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
        self.add_critic_worker(config)
        self.add_reward_model_resource_pool(config)
        self.add_teacher_model_resource_pool(config)
        validate_config(
            config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config)
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
        )
        trainer.init_workers()
        trainer.fit()


def run(config: Any) -> None:
    """Validates the AGL settings on the driver (fail fast, no GPU needed), then runs the Ray job."""
    settings_from_config(config)
    run_ppo(config, task_runner_class=AglTaskRunner)
