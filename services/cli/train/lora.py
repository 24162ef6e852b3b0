"""`agl train --lora-rank R`: the adapter's side of a local run.

The engine serves the base model under `<model>-base` and the run's adapter under the run's model name, which the
proxy routes every call to (issue 32; services/trainer/run/lora.py has the trainer's side). Before the trainer's first
push there is no adapter, so the smoke rollout would find no model by that name: the engine is given an adapter
whose B matrices are zero first, the base model's function exactly (what the actor's own fresh adapter computes
too, PEFT starting B at zero). At the end the newest adapter the trainer pushed is the run's result, a PEFT
directory; merged into the base model's weights on request.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
from pathlib import Path

from services.atomic_files import replace_dir

from ..errors import USAGE, CliError

BASE_SUFFIX = "-base"
ADAPTERS = Path("state") / "weights"
_ADAPTER = re.compile(r"adapter-v(\d+)")
# The projection the start adapter targets: every Qwen, Llama and Mistral layer has one (its B is zero, so which
# modules it names changes nothing it computes).
_TARGET = re.compile(r"^(?P<prefix>.*\.layers\.\d+\.self_attn\.q_proj)\.weight$")


def engine_model_name(model_name: str) -> str:
    return model_name + BASE_SUFFIX


def _tensor_shapes(model_dir: Path) -> dict[str, list[int]]:
    """Every tensor's shape, from the safetensors headers alone (nothing of the weights is read)."""
    shapes: dict[str, list[int]] = {}
    for file in sorted(model_dir.glob("*.safetensors")):
        with file.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
        shapes.update({name: entry["shape"] for name, entry in header.items() if name != "__metadata__"})
    return shapes


def write_start_adapter(model_dir: Path, target: Path, rank: int, alpha: int) -> Path:
    """A PEFT adapter of `rank` over model_dir whose every B is zero (written whole, then renamed into place)."""
    import numpy as np
    from safetensors.numpy import save_file

    tensors = {}
    for name, shape in _tensor_shapes(model_dir).items():
        found = _TARGET.match(name)
        if found and len(shape) == 2:
            out_features, in_features = shape
            prefix = "base_model.model." + found["prefix"]
            tensors[f"{prefix}.lora_A.weight"] = np.zeros((rank, in_features), dtype=np.float32)
            tensors[f"{prefix}.lora_B.weight"] = np.zeros((out_features, rank), dtype=np.float32)
    if not tensors:
        raise CliError(
            f"--lora-rank: {model_dir} has no self_attn.q_proj layers to start an adapter on (Qwen, Llama and "
            "Mistral models have them)",
            USAGE,
        )
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(model_dir),
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": 0.0,
        "target_modules": ["q_proj"],
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "modules_to_save": None,
    }
    partial = target.with_name(f".{target.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    save_file(tensors, str(partial / "adapter_model.safetensors"), metadata={"format": "pt"})
    (partial / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    for path in (partial, *partial.iterdir()):  # the engine may run as another user
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    shutil.rmtree(target, ignore_errors=True)
    os.replace(partial, target)
    return target


def newest_adapter(run_dir: Path) -> Path | None:
    """The last adapter the trainer pushed (state/weights/adapter-v<N>, the highest N), if any."""
    folder = run_dir / ADAPTERS
    versions = [(int(m[1]), p) for p in folder.glob("adapter-v*") if (m := _ADAPTER.fullmatch(p.name)) and p.is_dir()]
    return max(versions)[1] if versions else None


def export_adapter(run_dir: Path, base: Path, target: Path, source: Path | None = None) -> Path:
    """The newest pushed adapter (or `source`, the run's best) as target (a PEFT directory naming `base` as its
    base model)."""
    source = source or newest_adapter(run_dir)
    if source is None or not source.is_dir():
        raise CliError(f"{run_dir}: no adapter to export (the run stopped before its first update)", USAGE)
    partial = target.with_name(f".{target.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(source, partial)
    config_path = partial / "adapter_config.json"
    config = json.loads(config_path.read_text())
    config["base_model_name_or_path"] = str(base)
    config["inference_mode"] = True
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    replace_dir(partial, target)
    return target


def merge_adapter(base: Path, adapter: Path, target: Path, dtype: str, model_files: tuple[str, ...]) -> Path:
    """The base model with the adapter merged into its weights (PEFT's merge, in float32), as a model directory in
    `dtype` ("trained": the base model's own)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    if dtype == "trained":
        config = json.loads((base / "config.json").read_text())
        dtype = str(config.get("torch_dtype") or config.get("dtype") or "float32")
    merged = merged.to(getattr(torch, dtype))
    partial = target.with_name(f".{target.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    merged.save_pretrained(str(partial), safe_serialization=True)
    for name in model_files:  # the tokenizer and templates, as the base model has them
        if (base / name).is_file() and name not in ("config.json", "generation_config.json"):
            shutil.copy2(base / name, partial / name)
    replace_dir(partial, target)
    return target
