"""A run's latest weights as a Hugging Face model directory: the base model's config, tokenizer, chat template and
generation config, with the weights the trainer last pushed to the engines (the actor's full state, HF names),
in the dtype they were trained in unless asked otherwise. Loadable by transformers, servable by agl-engine/vLLM.

`agl export RUN` runs the same on a run's folder (a finished run, or one interrupted after a push).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from ..errors import USAGE, CliError

WEIGHTS = Path("state") / "weights" / "model.safetensors"
# What a model directory holds besides its weights (the base model's files, copied as they are).
_MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
)
DTYPE_NAMES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def base_model_of(run_dir: Path) -> Path:
    try:
        record = json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        raise CliError(f"{run_dir}: not a run folder of agl train (no readable run.json)", USAGE) from None
    return Path(record["base_model"])


def export_model(run_dir: Path, target: Path, *, dtype: str = "trained") -> Path:
    """Writes target (replacing it whole: a reader never sees a half-written directory); returns it."""
    import torch
    from safetensors.torch import load_file, save_file

    weights = run_dir / WEIGHTS
    if not weights.is_file():
        raise CliError(
            f"{run_dir}: no pushed weights at {weights} (the run stopped before its first weight push, or ran on "
            "GPUs with verl's own engines, whose weights stay in the checkpoints)",
            USAGE,
        )
    base = base_model_of(run_dir)
    if not (base / "config.json").is_file():
        raise CliError(f"{run_dir}: its base model {base} is gone (the config and tokenizer are copied from it)", USAGE)
    tensors = load_file(str(weights))
    if dtype != "trained":
        wanted = getattr(torch, DTYPE_NAMES[dtype])
        tensors = {name: t.to(wanted) if t.is_floating_point() else t for name, t in tensors.items()}
    floating = {str(t.dtype).removeprefix("torch.") for t in tensors.values() if t.is_floating_point()}
    partial = target.with_name(f".{target.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for name in _MODEL_FILES:
        if (base / name).is_file():
            shutil.copy2(base / name, partial / name)
    config = json.loads((partial / "config.json").read_text())
    if len(floating) == 1:
        config["torch_dtype"] = next(iter(floating))
        config.pop("dtype", None)
    (partial / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(tensors, str(partial / "model.safetensors"), metadata={"format": "pt"})
    if target.exists():
        old = target.with_name(f".{target.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(target, old)
        os.replace(partial, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(partial, target)
    return target


def resolve_run(run: str) -> Path:
    from .options import RUNS_DIR

    for candidate in (Path(run), RUNS_DIR / run):
        if (candidate / "run.json").is_file():
            return candidate.resolve()
    raise CliError(f"no run {run!r}: neither a run folder nor a run under {RUNS_DIR}/", USAGE)


def run_export_command(run: str, to: Path | None, dtype: str) -> int:
    run_dir = resolve_run(run)
    target = export_model(run_dir, (to or run_dir / "model").resolve(), dtype=dtype)
    print(f"model: {target}")
    return 0
