"""verl's task runner, building an AglPPOTrainer instead of its own: the body of runner.AglTaskRunner's one
method, run inside that Ray actor. It is the first module of the trainer that imports verl's training code, so the
driver (runner.py) never loads it."""

from __future__ import annotations

import logging
from typing import Any

import ray
from omegaconf import OmegaConf, open_dict
from verl.trainer.main_ppo_v0 import BaseTaskRunner
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import omega_conf_to_dataclass, validate_config

from services.trainer.config import settings_from_config
from services.trainer.rollouts.datasets import load_samples

log = logging.getLogger(__name__)


class TaskRunner(BaseTaskRunner):
    def run(self, config: Any) -> None:
        from services.trainer.verl.ppo_trainer import AglPPOTrainer

        OmegaConf.resolve(config)
        settings = settings_from_config(config)
        log.info("AGL trainer %r", settings)
        _, worker_group_cls = self.add_actor_rollout_worker(config)
        external = bool(config.agl.engines.external)
        if external:
            from services.trainer.verl.lora_worker import AglActorRolloutRefWorker

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
