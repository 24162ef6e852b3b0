"""A run's weights as a Hugging Face model directory: the base model's config, tokenizer, chat template and
generation config, with the weights of the run's best validation (RUN/best, kept by the trainer: services/trainer/
best.py) or its last step's (the weights the trainer last pushed to the engines, HF names; on GPUs, where verl's own
engines get the weights in memory, the HF weights saved with the newest checkpoint), in the dtype they were trained
in unless asked otherwise. Loadable by transformers, servable by agl-engine/vLLM.

`agl export RUN` runs the same on a run's folder (a finished run, or one interrupted after a push).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from services.atomic_files import replace_dir
from services.trainer.run.best import ADAPTER, Best, read_best

from ..errors import USAGE, CliError
from . import lora
from .options import WEIGHT_CHOICES

WEIGHTS = Path("state") / "weights" / "model.safetensors"
BEST_DIR = "best"
# What a model directory holds besides its weights (the base model's files, copied as they are).
MODEL_FILES = (
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


def checkpoint_weights(run_dir: Path) -> list[Path]:
    """The HF weights verl saved with the newest checkpoint (GPU runs save them: `hf_model` in save_contents)."""
    marker = run_dir / "checkpoints" / "latest_checkpointed_iteration.txt"
    if not marker.is_file():
        return []
    folder = run_dir / "checkpoints" / f"global_step_{marker.read_text().strip()}" / "actor" / "huggingface"
    return sorted(folder.glob("*.safetensors"))


@dataclass(frozen=True)
class Choice:
    """Which of a run's weights an export takes: "best" (its best validation's, `best` is that record) or "last"
    (`best` is still the record, when the run kept one, for the line that says what was not taken)."""

    which: str
    best: Best | None

    def describe(self) -> str:
        if self.best is None:
            return "the last step's weights (the run kept no best: it had no periodic validation)"
        scores = ", ".join(f"{step}: {reward:.3f}" for step, reward in self.best.validations)
        if self.which == "last":
            return (
                f"the last step's weights, as asked (the best validation was step {self.best.step}, "
                f"held-out reward {self.best.reward:.3f}; by step: {scores})"
            )
        return (
            f"the weights of step {self.best.step}, the best held-out reward ({self.best.reward:.3f}) of "
            f"{len(self.best.validations)} validations (by step: {scores}); the last step's: --weights last"
        )


def choose_weights(run_dir: Path, wanted: str | None) -> Choice:
    """wanted: "best", "last", or None for the best when the run kept one and the last otherwise."""
    if wanted not in (None, *WEIGHT_CHOICES):
        raise CliError(f"--weights {wanted!r}: choose one of {', '.join(WEIGHT_CHOICES)}", USAGE)
    best = read_best(run_dir / BEST_DIR)
    if wanted == "best" and best is None:
        raise CliError(
            f"--weights best: run {run_dir.name} kept no best weights (it had no periodic validation: train with "
            "--val FILE and --val-every N to keep them); --weights last takes the last step's",
            USAGE,
        )
    return Choice(wanted or ("best" if best is not None else "last"), best)


def weight_files(run_dir: Path, which: str = "last") -> list[Path]:
    """What holds the run's chosen weights. "best": RUN/best's files. "last": the file pushed to the engines after
    the last update (CPU runs and external engines), else the newest checkpoint's HF weights."""
    if which == "best":
        kept = sorted((run_dir / BEST_DIR).glob("*.safetensors"))
        if not kept:
            raise CliError(f"{run_dir}: {run_dir / BEST_DIR} holds no weights files", USAGE)
        return kept
    pushed = run_dir / WEIGHTS
    if pushed.is_file():
        return [pushed]
    saved = checkpoint_weights(run_dir)
    if saved:
        return saved
    raise CliError(
        f"{run_dir}: no weights to export: neither a pushed weights file ({pushed}) nor a checkpoint with HF weights "
        "(the run stopped before its first update or checkpoint)",
        USAGE,
    )


def export_model(run_dir: Path, target: Path, *, dtype: str = "trained", which: str = "last") -> Path:
    """Writes target (replacing it whole: a reader never sees a half-written directory); returns it."""
    import torch
    from safetensors.torch import load_file, save_file

    sources = weight_files(run_dir, which)
    base = base_model_of(run_dir)
    if not (base / "config.json").is_file():
        raise CliError(f"{run_dir}: its base model {base} is gone (the config and tokenizer are copied from it)", USAGE)
    partial = target.with_name(f".{target.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for name in MODEL_FILES:
        if (base / name).is_file():
            shutil.copy2(base / name, partial / name)
    index = sources[0].parent / "model.safetensors.index.json"
    if len(sources) > 1 and index.is_file():
        shutil.copy2(index, partial / index.name)
    floating: set[str] = set()
    for source in sources:
        tensors = load_file(str(source))
        if dtype != "trained":
            wanted = getattr(torch, DTYPE_NAMES[dtype])
            tensors = {name: t.to(wanted) if t.is_floating_point() else t for name, t in tensors.items()}
        floating |= {str(t.dtype).removeprefix("torch.") for t in tensors.values() if t.is_floating_point()}
        save_file(tensors, str(partial / source.name), metadata={"format": "pt"})
    config = json.loads((partial / "config.json").read_text())
    if len(floating) == 1:
        config["torch_dtype"] = next(iter(floating))
        config.pop("dtype", None)
    (partial / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    replace_dir(partial, target)
    return target


def resolve_run(run: str, markers: tuple[str, ...] = ("run.json",)) -> Path:
    """A run id under agl-runs/ or a run's folder: the first holding one of `markers`."""
    from .options import RUNS_DIR

    for candidate in (Path(run), RUNS_DIR / run):
        if any((candidate / marker).is_file() for marker in markers):
            return candidate.resolve()
    raise CliError(f"no run {run!r}: neither a run folder nor a run under {RUNS_DIR}/", USAGE)


def run_export_command(
    run: str, to: Path | None, dtype: str, merge_adapter: bool = False, weights: str | None = None
) -> int:
    export_run(run, to, dtype, merge_adapter, say=print, weights=weights)
    return 0


def export_run(
    run: str,
    to: Path | None,
    dtype: str,
    merge_adapter: bool = False,
    say: Callable[[str], object] = lambda _: None,
    weights: str | None = None,
) -> Path:
    """A run's model (RUN/model); a LoRA run's adapter (RUN/adapter), and with merge_adapter the base model with
    it merged in (RUN/model). weights: "best", "last", None (the best when kept). The folder written last (the
    merged model, else the adapter or the model)."""
    run_dir = resolve_run(run)
    choice = choose_weights(run_dir, weights)
    say(f"weights: {choice.describe()}")
    if json.loads((run_dir / "run.json").read_text()).get("lora_rank"):
        if dtype != "trained" and not merge_adapter:
            raise CliError("--dtype is the merged model's dtype in a LoRA run: add --merge-adapter", USAGE)
        base = base_model_of(run_dir)
        source = run_dir / BEST_DIR / ADAPTER if choice.which == "best" else None
        adapter = lora.export_adapter(run_dir, base, (to or run_dir / "adapter").resolve(), source=source)
        say(f"adapter: {adapter}")
        if not merge_adapter:
            return adapter
        merged = lora.merge_adapter(base, adapter, (run_dir / "model").resolve(), dtype, MODEL_FILES)
        say(f"model: {merged}")
        return merged
    if merge_adapter:
        raise CliError(f"--merge-adapter: run {run_dir.name} trained every weight, not an adapter", USAGE)
    target = export_model(run_dir, (to or run_dir / "model").resolve(), dtype=dtype, which=choice.which)
    say(f"model: {target}")
    return target
