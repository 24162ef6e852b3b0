"""AglPPOTrainer: verl's RayPPOTrainer with the rollout phase driven through the ledger.

GPU-only code path (verl workers, vLLM replicas); kept thin. Everything it decides is done by the tested
pieces: RolloutManager (rollouts), build_training_batch (data path), the per_rollout_mean loss.

A step: register the engines (version = global step) -> manager.collect -> [async: pause + drain proxies]
-> sleep the engines -> data path -> old/ref log-probs -> actor update (aligned mini-batches) -> weights to
the engines -> [async: resume proxies] -> metrics.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Iterator
from typing import Any

from omegaconf import OmegaConf, open_dict
from verl import DataProto
from verl.trainer.ppo.metric_utils import compute_data_metrics, compute_throughout_metrics, compute_timing_metrics
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.utils import tensordict_utils as tu
from verl.utils.debug import marked_timer
from verl.utils.metric import reduce_metrics
from verl.utils.py_functional import rename_dict
from verl.utils.tracking import Tracking
from verl.workers.utils.padding import left_right_2_no_padding

from services.client import LedgerClient

from .adapter import build_training_batch
from .config import TrainerSettings
from .datasets import TaskLoader
from .drain import HttpProxyDrainer, ProxyDrainer
from .hooks import load_hooks
from .loop_thread import LoopThread
from .loss import apply_row_weights
from .manager import RolloutManager
from .specs import Sample

log = logging.getLogger(__name__)


class AglPPOTrainer(RayPPOTrainer):
    def __init__(
        self,
        config: Any,
        tokenizer: Any,
        role_worker_mapping: Any,
        resource_pool_manager: Any,
        ray_worker_group_cls: Any,
        *,
        settings: TrainerSettings,
        train_samples: list[Sample],
        val_samples: list[Sample],
        processor: Any = None,
        device_name: str | None = None,
    ) -> None:
        self.agl = settings
        self.train_samples = train_samples
        self.val_samples = val_samples
        self._rng = random.Random(int(config.data.get("seed", 1) or 1))
        super().__init__(
            config=config,
            tokenizer=tokenizer,
            role_worker_mapping=role_worker_mapping,
            resource_pool_manager=resource_pool_manager,
            ray_worker_group_cls=ray_worker_group_cls,
            processor=processor,
            device_name=device_name,
        )

    # -- data: tasks in memory instead of verl's tokenised dataloader ---------------------------------------

    def _create_dataloader(self, *args: Any, **kwargs: Any) -> None:
        data = self.config.data
        self.train_dataloader = TaskLoader(
            self.train_samples, int(data.train_batch_size), shuffle=bool(data.get("shuffle", True)),
            seed=int(data.get("seed", 1) or 1),
        )  # fmt: skip
        self.val_dataloader = None
        total = len(self.train_dataloader) * int(self.config.trainer.total_epochs)
        if self.config.trainer.total_training_steps is not None:
            total = int(self.config.trainer.total_training_steps)
        self.total_training_steps = total
        OmegaConf.set_struct(self.config, True)
        with open_dict(self.config):
            if OmegaConf.select(self.config, "actor_rollout_ref.actor.optim"):
                self.config.actor_rollout_ref.actor.optim.total_training_steps = total
        log.info("%d tasks, %d steps per epoch, %d steps", len(self.train_samples), len(self.train_dataloader), total)

    # -- workers + the ledger side --------------------------------------------------------------------------

    def init_workers(self) -> None:
        super().init_workers()
        self.loop = LoopThread()
        self.ledger = LedgerClient(self.agl.ledger_address, self.agl.key)
        hooks = load_hooks(self.agl.hooks) if self.agl.hooks else None
        self.manager = RolloutManager(self.ledger, self.agl.manager, hooks=hooks)
        self.loop.run(self.manager.start())
        if self.agl.proxy_admin_url:
            self.drainer: Any = HttpProxyDrainer(
                self.agl.proxy_admin_url, self.agl.key, retry_after_seconds=self.agl.retry_after_seconds,
                timeout_s=self.agl.drain_timeout_s,
            )  # fmt: skip
        else:
            self.drainer = ProxyDrainer(
                self.ledger, retry_after_seconds=self.agl.retry_after_seconds, timeout_s=self.agl.drain_timeout_s
            )

    def _endpoints(self) -> list[str]:
        addresses = self.llm_server_manager.get_addresses()
        return [a if a.startswith("http") else f"http://{a}/v1" for a in addresses]

    def _register(self) -> None:
        self.loop.run(self.manager.register_endpoints(self.agl.model_name, self._endpoints(), self.global_steps))

    # -- validation through the ledger ----------------------------------------------------------------------

    def _validate(self, merged: bool = False) -> dict[str, float]:
        samples = self.val_samples[: self.agl.val_max_samples] if self.agl.val_max_samples else self.val_samples
        if not samples:
            return {}
        self._register()
        result = self.loop.run(self.manager.evaluate(self.global_steps, samples))
        rewards = [t.reward for t in result.traces]
        metrics = {f"val/{k}": v for k, v in result.metrics.items()}
        if rewards:
            metrics["val/agl/reward_mean"] = sum(rewards) / len(rewards)
        return metrics

    # -- the actor update with aligned mini-batches ---------------------------------------------------------

    def _update_actor_rows(self, batch: DataProto, mini_batch_rows: int) -> dict[str, float]:
        actor = self.config.actor_rollout_ref.actor
        batch.meta_info["multi_turn"] = True
        batch.meta_info["temperature"] = self.config.actor_rollout_ref.rollout.temperature
        batch_td = left_right_2_no_padding(batch.to_tensordict())
        tu.assign_non_tensor(
            batch_td,
            calculate_entropy=bool(actor.calculate_entropy or actor.entropy_coeff != 0.0),
            distillation_use_topk=False,
            distillation_only=False,
            global_batch_size=mini_batch_rows,
            mini_batch_size=mini_batch_rows,
            epochs=actor.ppo_epochs,
            seed=actor.data_loader_seed,
            dataloader_kwargs={"shuffle": actor.shuffle},
            compute_loss=True,
        )
        output = tu.get(self.actor_rollout_wg.update_actor(batch_td), "metrics")
        output = rename_dict(output, "actor/")
        output["perf/mfu/actor"] = output.pop("actor/mfu", 0.0)
        return reduce_metrics(output)

    # -- the loop -------------------------------------------------------------------------------------------

    def _train_step(self, samples: Iterator[Sample], metrics: dict[str, Any], timing: dict[str, float]) -> Any:
        with marked_timer("gen", timing):
            self._register()
            result = self.loop.run(self.manager.collect(self.global_steps, samples))
        metrics.update(result.metrics)
        if self.agl.async_enabled:
            drained = self.loop.run(self.drainer.pause_and_drain(f"step {self.global_steps} weight update"))
            metrics["agl/proxy/drain_s"] = drained.seconds
            metrics["agl/proxy/drained"] = float(drained.drained)
        self.checkpoint_manager.sleep_replicas()
        try:
            with marked_timer("adapt", timing):
                prepared = build_training_batch(
                    result.traces, self.agl.data_path, rng=self._rng, algo_config=self.config.algorithm,
                    counts=result.counts,
                )  # fmt: skip
            metrics.update(prepared.metrics)
            batch = prepared.data
            if batch is not None:
                batch.meta_info["global_token_num"] = batch.batch["attention_mask"].sum(dim=-1).tolist()
                with marked_timer("old_log_prob", timing):
                    old_log_prob, _ = self._compute_old_log_prob(batch)
                    old_log_prob.batch.pop("entropys")
                    batch = batch.union(old_log_prob)
                if self.use_reference_policy:
                    with marked_timer("ref", timing):
                        batch = batch.union(self._compute_ref_log_prob(batch))
                apply_row_weights(batch)
                with marked_timer("update_actor", timing):
                    metrics.update(self._update_actor_rows(batch, prepared.mini_batch_rows))
            else:
                log.warning("step %d: no trainable rows; weights unchanged", self.global_steps)
            save_freq = self.config.trainer.save_freq
            last = self.global_steps >= self.total_training_steps
            if save_freq > 0 and (last or self.global_steps % save_freq == 0):
                with marked_timer("save_checkpoint", timing):
                    self._save_checkpoint()
        finally:
            with marked_timer("update_weights", timing):
                self.checkpoint_manager.update_weights(self.global_steps)
            if self.agl.async_enabled:
                self.loop.run(self.drainer.resume())
        return batch

    def fit(self) -> None:
        tracker = Tracking(
            project_name=self.config.trainer.project_name,
            experiment_name=self.config.trainer.experiment_name,
            default_backend=self.config.trainer.logger,
            config={"agl_run_id": self.agl.run_id},
        )
        self.global_steps = 0
        self._load_checkpoint()
        self.checkpoint_manager.update_weights(self.global_steps)
        if self.config.trainer.get("val_before_train", False):
            tracker.log(data=self._validate(), step=self.global_steps)
        samples = self.train_dataloader.stream()
        self.global_steps += 1
        try:
            while self.global_steps <= self.total_training_steps:
                metrics: dict[str, Any] = {"training/global_step": self.global_steps}
                timing: dict[str, float] = {}
                started = time.monotonic()
                with marked_timer("step", timing):
                    batch = self._train_step(samples, metrics, timing)
                test_freq = self.config.trainer.test_freq
                if test_freq > 0 and self.global_steps % test_freq == 0:
                    metrics.update(self._validate())
                if batch is not None:
                    metrics.update(compute_data_metrics(batch=batch, use_critic=False))
                    metrics.update(compute_timing_metrics(batch=batch, timing_raw=timing))
                    n_gpus = self.resource_pool_manager.get_n_gpus()
                    metrics.update(compute_throughout_metrics(batch=batch, timing_raw=timing, n_gpus=n_gpus))
                metrics["agl/step/seconds"] = time.monotonic() - started
                tracker.log(data=metrics, step=self.global_steps)
                self.global_steps += 1
        finally:
            self.loop.run(self.manager.close())
            self.loop.run(self.ledger.close())
            self.loop.close()
