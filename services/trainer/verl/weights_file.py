"""Checkpoint-engine backend `agl_file`: the actor's full weights as one safetensors file, for engines AGL
did not start (a CPU vLLM, a separate vLLM deployment) that reload it from a directory they can read.

Registered in verl's CheckpointEngineRegistry (verl imports this module in each actor worker through
`actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module`); the actor's `update_weights` then
hands it the HF-named tensors. Only rank 0 writes, and atomically (a temporary file renamed into place), so
an engine never reads half a file. Telling the engines to reload is the trainer driver's job
(services/trainer/run/engine_push.py): it knows the engines from the ledger, and pauses the proxies around it.
A LoRA run writes its adapter instead (write_adapter, called by verl/lora_worker.py), one PEFT directory per version.

    actor_rollout_ref.rollout.checkpoint_engine.backend=agl_file
    actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=services.trainer.verl.weights_file
    +actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.agl_file.weights_dir=/abs/dir
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry

from services.trainer.run.lora import adapter_dir, prune_adapters

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


def adapter_config_json(peft_config: Any) -> str:
    """PEFT's adapter_config.json for the actor's LoRA config (verl hands it over as PEFT's to_dict())."""
    config = dict(peft_config if isinstance(peft_config, dict) else peft_config.to_dict())

    def plain(value: Any) -> Any:  # sets of module names and enums (peft_type, task_type) as JSON has them
        if isinstance(value, set | frozenset):
            return sorted(value)
        return getattr(value, "value", str(value))

    return json.dumps(config, indent=2, sort_keys=True, default=plain) + "\n"


def write_adapter(
    weights: Iterable[tuple[str, torch.Tensor]], peft_config: Any, weights_dir: Path, version: int, *, write: bool
) -> dict[str, float]:
    """The adapter's tensors (PEFT names) and its config as a PEFT directory, weights_dir/adapter-v<version>,
    which vLLM and transformers load: written whole beside it and renamed into place, so an engine never loads a
    half-written adapter. Older versions but the last two are removed."""
    started = time.perf_counter()
    tensors = {}
    for name, tensor in weights:
        if hasattr(tensor, "full_tensor"):
            tensor = tensor.full_tensor()
        if write:
            tensors[name] = tensor.detach().to("cpu").contiguous().clone()
    if not write:
        return {}
    if not tensors:
        raise RuntimeError("the actor has no LoRA weights to write (is actor_rollout_ref.model.lora_rank > 0?)")
    weights_dir.mkdir(parents=True, exist_ok=True)
    final = adapter_dir(weights_dir, version)
    partial = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=weights_dir))
    save_file(tensors, str(partial / "adapter_model.safetensors"), metadata={"format": "pt"})
    (partial / "adapter_config.json").write_text(adapter_config_json(peft_config))
    # mkdtemp and safetensors make them owner-only; an engine may run as another user.
    os.chmod(partial, 0o755)
    for file in partial.iterdir():
        os.chmod(file, 0o644)
    if final.exists():  # the same version again (a resumed run re-pushes its checkpoint's weights)
        shutil.rmtree(final)
    os.replace(partial, final)
    prune_adapters(weights_dir)
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

    def send_adapter(self, weights: Any, peft_config: Any, version: int) -> dict[str, float]:
        return write_adapter(weights, peft_config, self.weights_dir, version, write=self.is_master)

    async def receive_weights(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{BACKEND} only sends: external engines reload the file themselves")
