"""AglPPOTrainer: verl's RayPPOTrainer with the rollout phase driven through the ledger.

Everything it decides is done by tested pieces: RolloutManager (rollouts), build_training_batch (data
path), the per_rollout_mean loss, engine_push (external engines). Two placements of the same step:
- colocated (GPU): verl's own vLLM replicas beside the actor; weights through verl's checkpoint engine;
- external engines (`agl.engines.external`): engines AGL did not start (the CPU vLLM of the embedded
  default, a separate vLLM deployment), registered in the ledger; the actor is the only verl worker, writes
  its weights with the `agl_file` checkpoint engine, and the driver has every engine reload them.

A step: register/check the engines -> manager.collect -> infrastructure failures left out (infra_policy) and the
traces' health checked (guardrails: a warning line, or a stop) -> pause + drain the proxies -> [colocated: sleep
the replicas] -> data path, the rows' health checked -> old (and ref) log-probs, the log-prob gap checked -> actor
update on aligned mini-batches, skipped when no row carries an advantage -> weights to the engines -> resume the
proxies -> metrics -> checkpoint (after the step is on record: services/trainer/README.md, "Stops and restarts").
A stop reports the step's metrics, marks the run FAILED with its line and ends the job.

It is verl's trainer subclassed: the step's order lives here in one place, and each decision in it is a call into
one of the small modules above.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Iterator
from itertools import chain
from pathlib import Path
from typing import Any

import ray
from omegaconf import OmegaConf, open_dict
from verl import DataProto
from verl.single_controller.ray import RayClassWithInitArgs
from verl.single_controller.ray.base import create_colocated_worker_cls
from verl.trainer.ppo.metric_utils import compute_data_metrics, compute_throughout_metrics, compute_timing_metrics
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.trainer.ppo.utils import Role
from verl.utils import tensordict_utils as tu
from verl.utils.debug import marked_timer
from verl.utils.metric import reduce_metrics
from verl.utils.py_functional import rename_dict
from verl.utils.tracking import Tracking
from verl.workers.utils.padding import left_right_2_no_padding

from services.client import THROUGH_RESTARTS, LedgerClient, LedgerError
from services.trainer.config import TrainerSettings
from services.trainer.data import step_health as health
from services.trainer.data.adapter import build_training_batch
from services.trainer.data.guardrails import Guardrails, HealthStop, all_failed_line, judge_failed_line
from services.trainer.data.infra_policy import select, wholly_lost
from services.trainer.data.loss import apply_row_weights
from services.trainer.data.row_records import ROW_APPEND_BYTES, event_chunks, flags_by_rollout, row_events, row_records
from services.trainer.data.trace_stats import trace_metrics
from services.trainer.judge.group_judge import GroupJudge
from services.trainer.rollouts.datasets import TaskLoader
from services.trainer.rollouts.hooks import load_hooks
from services.trainer.rollouts.manager import RolloutManager, StepResult
from services.trainer.rollouts.rewind import SNAPSHOT_FILE
from services.trainer.rollouts.specs import Sample
from services.trainer.run import progress
from services.trainer.run.best import BestWeights
from services.trainer.run.drain import DrainResult, HttpProxyDrainer, ProxyDrainer
from services.trainer.run.engine_push import (
    Weights,
    catch_up,
    push_weights,
    registered_endpoints,
    until_one_serves,
    while_catching_up,
)
from services.trainer.run.lora import adapter_dir
from services.trainer.run.trajectory_log import TrajectoryLog
from services.trainer.verl.correction import apply_rollout_correction
from services.trainer.verl.loop_thread import LoopThread

log = logging.getLogger(__name__)


def logprob_agreement(batch: DataProto) -> dict[str, float]:
    """How far the engine's sampling log-probs are from the trainer's recomputation on the same rows.

    The rows were sampled with the weights of the last push, and old_log_probs are the actor's on the same
    weights: the difference is the weight sync's error (plus numerics), and must stay near zero."""
    if "rollout_log_probs" not in batch.batch or "old_log_probs" not in batch.batch:
        return {}
    mask = batch.batch["response_mask"].bool()
    if not bool(mask.any()):
        return {}
    diff = (batch.batch["old_log_probs"] - batch.batch["rollout_log_probs"]).abs()[mask]
    return {"agl/push/logprob_diff_max": float(diff.max()), "agl/push/logprob_diff_mean": float(diff.mean())}


def has_learning_signal(batch: DataProto) -> bool:
    """False when every trained token has a zero advantage: the gradient is zero, but Adam's momentum (and
    weight decay) would still move the weights, so the update is skipped."""
    mask = batch.batch["response_mask"].bool()
    return bool((batch.batch["advantages"][mask] != 0).any())


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
        if self.agl.external_engines:
            self._init_actor_workers()
        else:
            super().init_workers()
        self.loop = LoopThread()
        # The run outlives a ledger restart: each call waits it out (~35 s) rather than failing the step.
        self.ledger = LedgerClient(self.agl.ledger_address, self.agl.key, retry=THROUGH_RESTARTS)
        hooks = load_hooks(self.agl.hooks) if self.agl.hooks else None
        # A resumed run's manager goes back to the state saved with the checkpoint (trainer/rollouts/rewind.py).
        resumed = TaskLoader.resume_folder(self.config.trainer)
        judge = None
        if self.agl.judge is not None:  # rewards from a judge model (services/trainer/judge/)
            judge = GroupJudge(
                self.agl.judge, self.ledger, policy_model=self.agl.model_name, engine_key=self.agl.engine_api_key
            )
        self.manager = RolloutManager(
            self.ledger, self.agl.manager, hooks=hooks, judge=judge,
            resume_from=resumed / SNAPSHOT_FILE if resumed else None,
            # A checkpoint's groups are training groups (validation ends before the step is saved); validation
            # files may reuse the training files' ids.
            samples={s.data_id: s for s in self.train_samples},
        )  # fmt: skip
        self.guard = Guardrails(self.agl.health_limits, self.agl.health_rollouts_named, self.agl.health_min_count)
        self._token_texts: dict[int, str] = {}
        self._step_rows = {}
        # The step whose update the engines serve (set by each weight sync; fit syncs before the first step).
        self.weights_version = 0
        self._caught_up = 0
        if self.agl.row_records and self.agl.manager.keep_steps == 0:
            log.info("agl.retention.keep_steps=0: consumed rollouts are deleted at once, so no training rows are kept")
        self.loop.run(self.manager.start())
        self.trajectories: TrajectoryLog | None = None
        if self.agl.trajectory_log:
            inputs = {s.data_id: s.input for s in [*self.train_samples, *self.val_samples]}
            self.trajectories = TrajectoryLog(self.agl.trajectory_log, self.tokenizer.decode, inputs)
        self.best = BestWeights(Path(self.agl.best_dir)) if self.agl.best_dir else None
        # The pause names this run and holds a lease the drainer renews while the update runs: a trainer killed
        # mid-update leaves a pause the ledger lifts when the lease runs out.
        pause = {"owner": f"trainer:{self.agl.run_id}", "lease_s": self.agl.pause_lease_s,
                 "model_name": self.agl.pause_model_name}  # fmt: skip
        if self.agl.proxy_admin_url:
            self.drainer: Any = HttpProxyDrainer(
                self.agl.proxy_admin_url, self.agl.key, retry_after_seconds=self.agl.retry_after_seconds,
                timeout_s=self.agl.drain_timeout_s, **pause,
            )  # fmt: skip
        else:
            self.drainer = ProxyDrainer(
                self.ledger, retry_after_seconds=self.agl.retry_after_seconds, timeout_s=self.agl.drain_timeout_s,
                **pause,
            )  # fmt: skip

    def _init_actor_workers(self) -> None:
        """External engines: only the actor (and a reference policy when the KL loss needs one) as verl
        workers, no rollout replicas, no agent loop, no reward loop: the agents and the ledger do those."""
        self.resource_pool_manager.create_resource_pool()
        actor_role = Role.ActorRolloutRef if Role.ActorRolloutRef in self.role_worker_mapping else Role.ActorRollout
        pool = self.resource_pool_manager.get_resource_pool(actor_role)
        worker_cls = self.role_worker_mapping[actor_role]
        classes = {"actor": RayClassWithInitArgs(cls=worker_cls, config=self.config.actor_rollout_ref, role="actor")}
        if self.use_reference_policy and not self.ref_in_actor:
            classes["ref"] = RayClassWithInitArgs(cls=worker_cls, config=self.config.actor_rollout_ref, role="ref")
        group = self.ray_worker_group_cls(
            resource_pool=pool,
            ray_cls_with_init=create_colocated_worker_cls(class_dict=classes),
            device_name=self.device_name,
        )
        spawned = group.spawn(prefix_set=classes.keys())
        if "ref" in spawned:
            self.ref_policy_wg = spawned["ref"]
            self.ref_policy_wg.init_model()
        self.actor_rollout_wg = spawned["actor"]
        self.actor_rollout_wg.init_model()
        if self.ref_in_actor:
            self.ref_policy_wg = self.actor_rollout_wg
        self.checkpoint_manager = None
        self.llm_server_manager = None

    def _endpoints(self) -> list[str]:
        addresses = self.llm_server_manager.get_addresses()
        return [a if a.startswith("http") else f"http://{a}/v1" for a in addresses]

    def _register(self) -> None:
        if self.agl.external_engines:
            # The operator registered them; a missing engine is one clear error, not a hang on the proxies.
            endpoints = self.loop.run(registered_endpoints(self.ledger, self.agl.model_name))
            # One restarted since the last push serves its base model: it gets the current weights first.
            caught_up = self.loop.run(
                catch_up(self.ledger, self.agl.model_name, self._weights(), self.weights_version, endpoints)
            )
            self._caught_up = len(caught_up)
            return
        # Replace, not add: verl picks new ports at every launch, and a restarted trainer's old endpoints are dead.
        # The version is that of the weights the replicas serve (the step whose update they loaded), as push_weights
        # records it for external engines: captured calls carry the same model_version in both placements.
        self.loop.run(self.manager.replace_endpoints(self.agl.model_name, self._endpoints(), self.weights_version))

    def _weights(self) -> Weights:
        return Weights(Path(self.agl.weights_dir), adapter=self.agl.adapter_push, api_key=self.agl.engine_api_key)

    def _during_rollouts(self, work: Any) -> Any:
        """Runs the rollouts' coroutine on the loop; external engines that restart meanwhile are caught up."""
        if not self.agl.external_engines or self.agl.engine_check_s <= 0:
            return self.loop.run(work)
        result, caught = self.loop.run(
            while_catching_up(
                work, self.ledger, self.agl.model_name, self._weights(), self.weights_version, self.agl.engine_check_s,
            )
        )  # fmt: skip
        self._caught_up += len(caught)
        return result

    def _sync_weights(self, metrics: dict[str, Any]) -> None:
        """The actor's current weights to every engine, at version = global step."""
        self.weights_version = self.global_steps
        if not self.agl.external_engines:
            self.checkpoint_manager.update_weights(self.global_steps)
            self._register()
            return
        written = self.actor_rollout_wg.update_weights(global_steps=self.global_steps)
        if isinstance(written, list) and written and isinstance(written[0], ray.ObjectRef):
            written = ray.get(written)
        for part in written if isinstance(written, list) else [written]:
            if isinstance(part, dict):
                metrics.update(part)
        pushed = self.loop.run(push_weights(self.ledger, self.agl.model_name, self._weights(), self.global_steps))
        metrics["agl/push/engines"] = float(len(pushed.endpoints))
        metrics["agl/push/deferred_engines"] = float(len(pushed.deferred))
        metrics["agl/push/reload_s"] = pushed.slowest_s
        metrics["agl/push/seconds"] = pushed.seconds

    # -- validation through the ledger ----------------------------------------------------------------------

    def _validate(self, merged: bool = False) -> dict[str, float]:
        samples = self.val_samples[: self.agl.val_max_samples] if self.agl.val_max_samples else self.val_samples
        if not samples:
            return {}
        self._register()
        result = self._during_rollouts(self.manager.evaluate(self.global_steps, samples))
        if self.trajectories is not None:
            self.trajectories.write(self.global_steps, result.traces, kind="validation")
        # A validation rollout lost to the infrastructure is no answer of the model's: left out of the mean.
        selection = select(result.traces, self.agl.infra, 1)
        rewards = [t.reward for t in selection.kept]
        metrics = {f"val/{k}": v for k, v in {**result.metrics, **selection.metrics}.items()}
        if rewards:
            metrics["val/agl/reward_mean"] = sum(rewards) / len(rewards)
        metrics.update(trace_metrics(result.traces, prefix="val/agl"))
        metrics.update(health.trace_health(result.traces, self.agl.infra.reasons).metrics(health.VAL_PREFIX))
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

    def _log_probs(self, batch: DataProto, metrics: dict[str, Any], timing: dict[str, float]) -> DataProto:
        # The worker scales logits by this temperature; verl's fit sets it when it builds the batch.
        batch.meta_info["temperature"] = self.config.actor_rollout_ref.rollout.temperature
        batch.meta_info["global_token_num"] = batch.batch["attention_mask"].sum(dim=-1).tolist()
        with marked_timer("old_log_prob", timing):
            old_log_prob, _ = self._compute_old_log_prob(batch)
            entropys = old_log_prob.batch.pop("entropys")
            mask = batch.batch["response_mask"].bool()
            if bool(mask.any()):
                metrics["actor/entropy"] = float(entropys[mask].mean())
            batch = batch.union(old_log_prob)
        # verl's rollout correction as its fit applies it (IS weights, rejection, rows without engine log-probs).
        metrics.update(apply_rollout_correction(batch, self.config.algorithm))
        metrics.update(logprob_agreement(batch))
        if self.use_reference_policy:
            with marked_timer("ref", timing):
                batch = batch.union(self._compute_ref_log_prob(batch))
        return batch

    def _train_step(self, samples: Iterator[Sample], metrics: dict[str, Any], timing: dict[str, float]) -> Any:
        """One step; what it made of each consumed rollout is recorded in the ledger, also when it stops the run."""
        self._step_rows: dict[str, Any] = {}
        try:
            batch = self._train_step_body(samples, metrics, timing)
        except HealthStop:
            self._record_rows(metrics, timing)
            raise
        self._record_rows(metrics, timing)
        return batch

    def _collect(self, samples: Iterator[Sample], metrics: dict[str, Any]) -> StepResult:
        """The step's rollouts. A step whose every rollout was lost to the infrastructure (an engine restart that
        outlasted the agents' own retries) has nothing to train on: its tasks run again, once an engine serves the
        current weights, up to agl.infra_failures.step_redos times; what it lost is in the trajectory log as "lost"
        and counted. Still lost after that, the run stops on it (all_failed_line)."""
        step = self.global_steps
        result = self._during_rollouts(self.manager.collect(step, samples))
        redos = lost = 0
        while wholly_lost(result.traces, self.agl.infra) and redos < self.agl.infra.step_redos:
            redos += 1
            lost += len(result.traces)
            first = result.traces[0]
            if self.trajectories is not None:
                self.trajectories.write(step, result.traces, kind="lost")
            log.warning(
                "step %d: all %d rollouts were lost to the infrastructure (first: rollout %s, %s: %s); running its "
                "tasks again (%d of at most %d)", step, len(result.traces), first.rollout_id, first.failure_reason,
                first.error_message or "no error message recorded", redos, self.agl.infra.step_redos,
            )  # fmt: skip
            if self.agl.external_engines:
                waited = self.loop.run(
                    until_one_serves(
                        self.ledger, self.agl.model_name, self._weights(), self.weights_version,
                        timeout_s=self.agl.infra.redo_wait_s, interval_s=max(self.agl.engine_check_s, 0.5),
                    )
                )  # fmt: skip
                log.info("step %d: an engine serves weights v%d again after %.1fs", step, self.weights_version, waited)
            # The lost groups' own tasks, in the order they were consumed (async mode: they may be older than
            # this step); in sync mode they are the step's whole batch, so nothing new is drawn.
            tasks = [self.manager.sample_of(data_id) for data_id in dict.fromkeys(t.data_id for t in result.traces)]
            result = self._during_rollouts(self.manager.collect(step, chain(tasks, samples), redo=redos))
        metrics["agl/step/redone"] = float(redos)
        metrics["agl/step/lost_rollouts"] = float(lost)
        return result

    def _train_step_body(self, samples: Iterator[Sample], metrics: dict[str, Any], timing: dict[str, float]) -> Any:
        with marked_timer("gen", timing):
            self._register()
            result = self._collect(samples, metrics)
        metrics.update(result.metrics)
        metrics["agl/push/caught_up_engines"] = float(self._caught_up)
        step = self.global_steps
        # Groups the judge could not score are left out; a step it scored none of has nothing to train on.
        judge_failed = [(f.group_id, f.rollout_ids, f.reason) for f in result.judge_failures]
        stop = judge_failed_line(step, judge_failed, len(result.group_ids))
        if stop is not None:
            raise HealthStop(stop)
        with marked_timer("health", timing):
            # Infrastructure failures out of the advantage; the traces' health from every consumed rollout.
            selection = select(result.traces, self.agl.infra, int(self.config.actor_rollout_ref.rollout.n))
            traces = selection.kept
            metrics.update(selection.metrics)
            step_health = health.trace_health(result.traces, self.agl.infra.reasons)
            step_health.update(health.group_health(traces, self.guard.identical_steps))
            if self.agl.judge is not None:
                step_health.update(health.judge_health([f[:2] for f in judge_failed], len(result.group_ids)))
            self.guard.identical_steps = int(step_health.value(health.IDENTICAL_REWARD_STEPS))
            metrics.update(step_health.metrics())
            metrics.update(trace_metrics(result.traces))
        self._step_rows.update(step=step, traces=result.traces, selection=selection, health=step_health)
        if traces:
            metrics["agl/reward/mean"] = sum(t.reward for t in traces) / len(traces)
        if self.trajectories is not None:
            self.trajectories.write(step, result.traces, kind="train")
        stop = all_failed_line(step, result.traces, self.agl.infra.reasons)
        if stop is not None:
            redos = int(metrics["agl/step/redone"])
            raise HealthStop(f"{stop} (its tasks were run {redos} more time(s))" if redos else stop)
        judged = health.JUDGE_NAMES if self.agl.judge is not None else ()
        warnings = self.guard.enforce(step, step_health, (*health.TRACE_NAMES, *health.GROUP_NAMES, *judged))
        metrics["agl/health/warnings"] = float(warnings)
        # Always: in async mode calls are in flight; in sync mode a late call must not reach a sleeping replica
        # (colocated) or straddle a reload (external engines).
        drained: DrainResult = self.loop.run(self.drainer.pause_and_drain(f"step {self.global_steps} weight update"))
        metrics["agl/proxy/drain_s"] = drained.seconds
        metrics["agl/proxy/drained"] = float(drained.drained)
        if not self.agl.external_engines:
            self.checkpoint_manager.sleep_replicas()
        updated = False
        batch = None
        try:
            with marked_timer("adapt", timing):
                prepared = build_training_batch(
                    traces, self.agl.data_path, rng=self._rng, algo_config=self.config.algorithm,
                    counts=result.counts, weights_version=self.weights_version,
                )  # fmt: skip
            metrics.update(prepared.metrics)
            self._step_rows["prepared"] = prepared
            if prepared.health is not None:
                metrics.update(prepared.health.metrics())
                warnings += self.guard.enforce(step, prepared.health, health.ROW_NAMES)
                metrics["agl/health/warnings"] = float(warnings)
            batch = prepared.data
            if batch is not None and not has_learning_signal(batch):
                log.info("step %d: every trained row has a zero advantage; weights unchanged", self.global_steps)
                metrics["agl/update/skipped_no_signal"] = 1.0
            elif batch is not None:
                if self.config.trainer.get("balance_batch", False) and self.actor_rollout_wg.world_size > 1:
                    self._balance_batch(batch, metrics=metrics)
                batch = self._log_probs(batch, metrics, timing)
                if "agl/push/logprob_diff_mean" in metrics:
                    gap = health.StepHealth(values={health.LOGPROB_GAP: float(metrics["agl/push/logprob_diff_mean"])})
                    metrics.update(gap.metrics())
                    warnings += self.guard.enforce(step, gap, (health.LOGPROB_GAP,))
                    metrics["agl/health/warnings"] = float(warnings)
                self._step_rows["batch"] = batch
                apply_row_weights(batch)
                with marked_timer("update_actor", timing):
                    metrics.update(self._update_actor_rows(batch, prepared.mini_batch_rows))
                updated = True
                metrics["agl/update/skipped_no_signal"] = 0.0
            else:
                log.warning("step %d: no trainable rows; weights unchanged", self.global_steps)
        finally:
            # Colocated replicas were put to sleep and must be woken with weights either way; external engines
            # keep serving what they have when nothing changed.
            if updated or not self.agl.external_engines:
                with marked_timer("update_weights", timing):
                    self._sync_weights(metrics)
            self.loop.run(self.drainer.resume())
        return batch if updated else None

    def _token_text(self, ids: Any) -> list[str]:
        """Each token id as the text it decodes to alone (cached: a step repeats the same ids)."""
        cache = self._token_texts
        missing = [i for i in dict.fromkeys(int(i) for i in ids) if i not in cache]
        if missing:
            cache.update(zip(missing, self.tokenizer.batch_decode([[i] for i in missing]), strict=True))
        return [cache[int(i)] for i in ids]

    def _record_rows(self, metrics: dict[str, Any], timing: dict[str, float]) -> None:
        """The step's agl_training_rows events (services/trainer/data/row_records.py) for the console."""
        done = self._step_rows
        if not self.agl.row_records or "traces" not in done:
            return
        with marked_timer("record_rows", timing):
            prepared = done.get("prepared")
            rows = prepared.rows if prepared is not None else []
            step_health = health.StepHealth()
            step_health.update(done["health"])
            if prepared is not None and prepared.health is not None:
                step_health.update(prepared.health)
            trained: set[tuple[str, int]] = set()
            recomputed: dict[tuple[str, int], list[float]] = {}
            batch = done.get("batch")
            if batch is not None:
                lengths = {(r.rollout_id, r.turn_index): len(r.response_ids) for r in rows}
                old = batch.batch.get("old_log_probs", None)
                pairs = zip(batch.non_tensor_batch["rollout_id"], batch.non_tensor_batch["turn_index"], strict=True)
                for i, (rid, turn) in enumerate(pairs):
                    key = (str(rid), int(turn))
                    trained.add(key)
                    if old is not None and key in lengths:
                        recomputed[key] = old[i, : lengths[key]].tolist()
            selection = done["selection"]
            evidence = {name: step_health.rollouts(name) for name in health.NAMES}
            records = row_records(
                done["step"], done["traces"], {t.rollout_id for t in selection.kept}, selection.left_out, rows,
                prepared.advantages if prepared is not None else {}, trained, recomputed,
                flags_by_rollout(evidence), self._token_text,
            )  # fmt: skip
            events = row_events(done["step"], records, {t.rollout_id: t.attempt_id for t in done["traces"]})
            try:
                # In appends of a few MB: a large step's rows (long responses, many rollouts) would pass the ledger's
                # message limit in one.
                for chunk in event_chunks(events, ROW_APPEND_BYTES):
                    self.loop.run(self.ledger.append_events(chunk, allow_terminal=True))
            except LedgerError as err:
                log.warning("step %d: recording the training rows failed (%s: %s)", done["step"], err.code().name,
                            err.details())  # fmt: skip
                return
        metrics["agl/rows/recorded_rollouts"] = float(len(events))

    def _run_summary(self) -> dict[str, Any]:
        return {
            "adv_estimator": str(self.config.algorithm.adv_estimator),
            "model_path": str(self.config.actor_rollout_ref.model.path),
            "n": int(self.config.actor_rollout_ref.rollout.n),
            "train_batch_size": int(self.config.data.train_batch_size),
            "lr": float(self.config.actor_rollout_ref.actor.optim.lr),
            "total_training_steps": self.total_training_steps,
            "placement": "external engines" if self.agl.external_engines else "colocated",
            # Read by `agl run ID --health` and the console to mark the steps over a limit.
            "health_limits": self.guard.describe(),
        }

    def _report(self, tracker: Tracking, metrics: dict[str, Any]) -> None:
        """Each step's metrics to verl's trackers and to the ledger's run (for `agl run` and the console)."""
        tracker.log(data=metrics, step=self.global_steps)
        self.loop.run(progress.report_step(self.ledger, self.agl.run_id, self.global_steps, metrics))

    def _save(self) -> None:
        started = time.monotonic()
        # Before verl's save, which declares the checkpoint whole last (its tracker file).
        self.manager.snapshot(self._checkpoint_folder(self.global_steps) / SNAPSHOT_FILE, self.global_steps)
        self._save_checkpoint()
        log.info("step %d: checkpoint saved in %.1fs", self.global_steps, time.monotonic() - started)

    def _checkpoint_folder(self, step: int) -> Path:
        return Path(str(self.config.trainer.default_local_dir)) / f"global_step_{step}"

    def _keep_if_best(self, metrics: dict[str, Any]) -> None:
        """A validation that beats the run's earlier ones: the weights it scored are kept (trainer/run/best.py).
        External engines were given them as a file (or an adapter directory); verl's own replicas got them in
        memory, so the step's checkpoint (saved now if the save frequency did not) holds them in HF form, and the
        start of a fresh run is the base model's own files."""
        if self.best is None:
            return
        if not self.best.is_better(metrics):  # noted in the record's history, the kept weights stay
            self.best.record(self.global_steps, metrics)
            return
        adapter = adapter_dir(Path(self.agl.weights_dir), self.weights_version) if self.agl.adapter_push else None
        if adapter is not None:
            files, where = [], adapter
        elif self.agl.external_engines:
            where = Path(self.agl.weights_dir)
            files = sorted(where.glob("*.safetensors"))
        else:
            where = self._checkpoint_folder(self.global_steps) / "actor" / "huggingface"
            if self.global_steps > 0 and not any(where.glob("*.safetensors")):
                self._save()
            if self.global_steps == 0 and not any(where.glob("*.safetensors")):
                where = Path(str(self.config.actor_rollout_ref.model.path))
            files = sorted([*where.glob("*.safetensors"), *where.glob("model.safetensors.index.json")])
        if not files and not (adapter is not None and adapter.is_dir()):
            log.warning("step %d: a new best held-out reward, but no weights in %s to keep", self.global_steps, where)
            return
        self.best.record(self.global_steps, metrics, files=files, adapter=adapter)

    def _forget_after(self, step: int) -> None:
        """The run's own records of steps after the checkpoint it resumed from: those steps are done again."""
        if self.trajectories is not None:
            dropped = self.trajectories.forget_after(step)
            if dropped:
                log.info("trajectory log: dropped %d records of steps after %d, which are done again", dropped, step)
        if self.best is not None:
            self.best.forget_after(step)

    def fit(self) -> None:
        tracker = Tracking(
            project_name=self.config.trainer.project_name,
            experiment_name=self.config.trainer.experiment_name,
            default_backend=self.config.trainer.logger,
            config={"agl_run_id": self.agl.run_id},
        )
        self.global_steps = 0
        self._load_checkpoint()
        self._forget_after(self.global_steps)
        # verl restores the loader's position except at an epoch boundary; the task order must resume too.
        self.train_dataloader.resume(self.config.trainer, self.global_steps)
        labels = {"model": self.agl.model_name}
        self.loop.run(progress.start_run(self.ledger, self.agl.run_id, labels, self._run_summary()))
        error: str | None = None
        try:
            # A trainer stopped during a weight update left the proxies paused, and the pause is durable: lifted
            # here, or every agent call of this run would get 429 (no update of this run is in flight yet).
            self.loop.run(self.drainer.resume())
            start_metrics: dict[str, Any] = {}
            # The engines start from the base model; after a resume they must serve the checkpoint's weights.
            self._sync_weights(start_metrics)
            val_only = bool(self.config.trainer.get("val_only", False))
            if val_only or self.config.trainer.get("val_before_train", False):
                start_metrics.update(self._validate())
                self._keep_if_best(start_metrics)
            if start_metrics:
                self._report(tracker, start_metrics)
            if val_only:  # validates and ends (the run is recorded succeeded); verl's own meaning of the key
                log.info("trainer.val_only: validated at step %d, no training", self.global_steps)
                return
            samples = self.train_dataloader.stream()
            self.global_steps += 1
            test_freq = self.config.trainer.test_freq
            while self.global_steps <= self.total_training_steps:
                metrics: dict[str, Any] = {"training/global_step": self.global_steps}
                timing: dict[str, float] = {}
                started = time.monotonic()
                try:
                    with marked_timer("step", timing):
                        batch = self._train_step(samples, metrics, timing)
                except HealthStop:
                    # The step that showed it is on record (`agl run ID --health`) before the run ends; the line
                    # itself is the driver's last word (services/trainer/__main__.py).
                    metrics["agl/health/stopped"] = 1.0
                    metrics.update({f"timing_s/{k}": v for k, v in timing.items()})
                    self._report(tracker, metrics)
                    raise
                last = self.global_steps >= self.total_training_steps
                if test_freq > 0 and (self.global_steps % test_freq == 0 or last):
                    with marked_timer("testing", timing):
                        metrics.update(self._validate())
                if batch is not None:
                    metrics.update(compute_data_metrics(batch=batch, use_critic=False))
                    metrics.update(compute_timing_metrics(batch=batch, timing_raw=timing))
                    n_gpus = self.resource_pool_manager.get_n_gpus()
                    metrics.update(compute_throughout_metrics(batch=batch, timing_raw=timing, n_gpus=n_gpus))
                metrics["agl/step/seconds"] = time.monotonic() - started
                metrics.update({f"timing_s/{k}": v for k, v in timing.items()})
                self._report(tracker, metrics)
                # Saved after the step is on record: a checkpointed step always has its metrics and trajectories.
                # A trainer stopped between the two redoes the step, and the redo's records replace the first
                # pass's (_forget_after).
                save_freq = self.config.trainer.save_freq
                if save_freq > 0 and (last or self.global_steps % save_freq == 0):
                    self._save()
                self._keep_if_best(metrics)
                self.global_steps += 1
        except HealthStop as exc:
            error = f"health stop: {exc}"
            raise
        except BaseException as exc:
            error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            self.loop.run(self.manager.close())
            try:
                self.loop.run(progress.finish_run(self.ledger, self.agl.run_id, error))
            except Exception:  # the run's own outcome (or its error) matters more than its ledger record
                log.exception("could not record the end of run %s in the ledger", self.agl.run_id)
            self.loop.run(self.ledger.close())
            self.loop.close()
            tracker.finish()
