"""LoRA runs on external engines: whether a run trains an adapter, and where each version of it is written.

verl trains a LoRA adapter when `actor_rollout_ref.model.lora_rank` > 0 (only the adapter's weights are updated;
the reference policy is the base model with the adapter disabled). Its checkpoint-engine path would hand an
external engine's backend the *base* weights with the adapter left out (verl's collect_lora_params), so the
engines would never see what was trained: AGL's actor worker (verl/lora_worker.py) writes the adapter itself instead,
as a PEFT directory per version, and the engines load it under the run's model name (vLLM's runtime LoRA
loading). With `actor_rollout_ref.model.lora.merge=true` the adapter is merged into the base weights and the full
weights are pushed as without LoRA.

Pure: no verl, no grpc.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

ADAPTER_DIR_PREFIX = "adapter-v"
# Versions of the adapter kept in the weights directory: the one the engines serve and the one before it (a
# restarted trainer's catch-up, or an engine slow to load, may still read it).
KEPT_ADAPTERS = 2


def lora_rank(model: Any) -> int:
    """The adapter rank a model config (`actor_rollout_ref.model`) trains, as verl reads it; 0: no LoRA."""
    rank = int((model.get("lora") or {}).get("rank", 0) or 0)
    return rank if rank > 0 else int(model.get("lora_rank", 0) or 0)


def trains_adapter(model: Any) -> bool:
    """Whether the engines are given an adapter (LoRA, not merged into the base weights)."""
    return lora_rank(model) > 0 and not bool((model.get("lora") or {}).get("merge", False))


def adapter_dir(weights_dir: Path, version: int) -> Path:
    return weights_dir / f"{ADAPTER_DIR_PREFIX}{version}"


def adapter_versions(weights_dir: Path) -> list[int]:
    """The versions of the adapter written under weights_dir, oldest first."""
    pattern = re.compile(rf"{re.escape(ADAPTER_DIR_PREFIX)}(\d+)")
    found = (pattern.fullmatch(p.name) for p in weights_dir.glob(f"{ADAPTER_DIR_PREFIX}*") if p.is_dir())
    return sorted(int(m.group(1)) for m in found if m)


def prune_adapters(weights_dir: Path, keep: int = KEPT_ADAPTERS) -> None:
    for version in adapter_versions(weights_dir)[:-keep]:
        shutil.rmtree(adapter_dir(weights_dir, version), ignore_errors=True)
