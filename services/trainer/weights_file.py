"""Checkpoint-engine backend `agl_file`: the actor's full weights as one safetensors file, for engines AGL
did not start (a CPU vLLM, a separate vLLM deployment) that reload it from a directory they can read.

Registered in verl's CheckpointEngineRegistry (verl imports this module in each actor worker through
`actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module`); the actor's `update_weights` then
hands it the HF-named tensors. Only rank 0 writes, and atomically (a temporary file renamed into place), so
an engine never reads half a file. Telling the engines to reload is the trainer driver's job
(services/trainer/engine_push.py): it knows the engines from the ledger, and pauses the proxies around it.

    actor_rollout_ref.rollout.checkpoint_engine.backend=agl_file
    actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=services.trainer.weights_file
    +actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.agl_file.weights_dir=/abs/dir
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry

BACKEND = "agl_file"
WEIGHTS_FILE = "model.safetensors"


def write_weights(weights: Iterable[tuple[str, torch.Tensor]], weights_dir: Path, *, write: bool) -> dict[str, float]:
    """Gathers every tensor (a collective on sharded ones, so every rank iterates) and, on the writing rank,
    saves them to weights_dir/model.safetensors atomically."""
    started = time.perf_counter()
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in weights:
        if hasattr(tensor, "full_tensor"):  # a DTensor shard: all ranks take part in the gather
            tensor = tensor.full_tensor()
        if write:
            tensors[name] = tensor.detach().to("cpu").contiguous().clone()
    if not write:
        return {}
    weights_dir.mkdir(parents=True, exist_ok=True)
    partial = weights_dir / f".{WEIGHTS_FILE}.{os.getpid()}.tmp"
    save_file(tensors, str(partial), metadata={"format": "pt"})
    os.replace(partial, weights_dir / WEIGHTS_FILE)
    size = sum(t.numel() * t.element_size() for t in tensors.values())
    return {"agl/push/save_s": time.perf_counter() - started, "agl/push/bytes": float(size)}


@CheckpointEngineRegistry.register(BACKEND)
class FileCheckpointEngine(CheckpointEngine):
    """Writes the weights for external engines; there is no receiving side inside verl."""

    def __init__(self, bucket_size: int = 0, is_master: bool = False, weights_dir: str = "", **_: Any) -> None:
        if not weights_dir or not os.path.isabs(weights_dir):
            raise ValueError(
                f"checkpoint_engine.engine_kwargs.{BACKEND}.weights_dir must be an absolute directory the engines "
                f"can read, not {weights_dir!r}"
            )
        self.is_master = is_master
        self.weights_dir = Path(weights_dir)

    def prepare(self) -> dict[str, Any]:
        return {}

    @classmethod
    def build_topology(cls, *args: Any, **kwargs: Any) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        return {}, {}

    def init_process_group(self, **kwargs: Any) -> None:
        return None

    def finalize(self) -> None:
        return None

    async def send_weights(self, weights: Any, global_steps: int | None = None) -> dict[str, float]:
        return write_weights(weights, self.weights_dir, write=self.is_master)

    async def receive_weights(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{BACKEND} only sends: external engines reload the file themselves")
