"""verl's actor worker with one change for LoRA runs on external engines: the weight update writes the adapter.

verl's checkpoint-engine path (`update_weights` with a backend other than `naive`) exports the actor's weights
with `get_per_tensor_param()`, which for an un-merged LoRA model yields the base weights without the adapter: an
external engine would reload the base model after every step and never serve what was trained. Here the
adapter's own tensors and config are exported instead (what verl's colocated path sends its vLLM) and written as
a PEFT directory by the `agl_file` backend (weights_file.write_adapter); the driver then has each engine load it
(run/engine_push.py). Every other call is verl's.
"""

from __future__ import annotations

from typing import Any

from verl.single_controller.base.decorator import Dispatch, register
from verl.workers.engine_workers import ActorRolloutRefWorker

from services.trainer.run.lora import trains_adapter
from services.trainer.verl.weights_file import BACKEND


class AglActorRolloutRefWorker(ActorRolloutRefWorker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    async def update_weights(self, global_steps: int | None = None, mode: str = "auto") -> Any:
        backend = mode if mode != "auto" else self.config.rollout.checkpoint_engine.backend
        if backend != BACKEND or not trains_adapter(self.config.model):
            return await super().update_weights(global_steps=global_steps, mode=mode)
        # Every rank takes part (the adapter's shards are gathered); rank 0 writes.
        weights, peft_config = self.actor.engine.get_per_tensor_param(layered_summon=False, base_sync_done=True)
        if peft_config is None:
            raise RuntimeError(
                "actor_rollout_ref.model.lora_rank > 0 but the actor's model has no LoRA adapter: verl did not "
                "wrap it (see the actor worker's log)"
            )
        return self.checkpoint_engine.send_adapter(weights, peft_config, int(global_steps or 0))
