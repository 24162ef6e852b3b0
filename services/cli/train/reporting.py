"""`agl train --report-to`: the run's metrics also to TensorBoard, Weights & Biases or MLflow, through verl's own
loggers (trainer.logger), each writing inside the run folder unless the user's environment says otherwise."""

from __future__ import annotations

import importlib.util
import netrc
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..errors import USAGE, CliError

TARGETS = ("tensorboard", "wandb", "mlflow")
# W&B modes that need no account.
WANDB_LOCAL_MODES = ("offline", "disabled", "dryrun")


def parse_targets(values: Sequence[str]) -> tuple[str, ...]:
    """--report-to, repeated or comma-separated, in order without repeats; an unknown name is one line."""
    wanted: list[str] = []
    for value in values:
        for name in (part.strip() for part in str(value).split(",")):
            if name not in TARGETS:
                raise CliError(f"--report-to {name!r}: one of {', '.join(TARGETS)}", USAGE)
            if name not in wanted:
                wanted.append(name)
    return tuple(wanted)


def check_targets(targets: Sequence[str], environ: Mapping[str, str] = os.environ) -> None:
    """What would fail only when the trainer starts (minutes later) fails now, in one line."""
    if "mlflow" in targets and importlib.util.find_spec("mlflow") is None:
        raise CliError("--report-to mlflow: mlflow is not installed here (pip install mlflow)", USAGE)
    if "wandb" in targets and not _wandb_usable(environ):
        raise CliError(
            "--report-to wandb: no W&B account here (set WANDB_API_KEY or run `wandb login`), or set "
            "WANDB_MODE=offline to write the run to the run folder and `wandb sync` it later",
            USAGE,
        )


def _wandb_usable(environ: Mapping[str, str]) -> bool:
    if environ.get("WANDB_API_KEY") or environ.get("WANDB_MODE", "") in WANDB_LOCAL_MODES:
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError):
        return False


def trainer_loggers(targets: Sequence[str]) -> str:
    return "trainer.logger=[" + ",".join(["console", "file", *targets]) + "]"


def trainer_environment(
    targets: Sequence[str], output: Path, environ: Mapping[str, str] = os.environ
) -> dict[str, str]:
    """Where each logger writes: the run folder, unless the user set the logger's own variable."""
    env: dict[str, str] = {}
    if "tensorboard" in targets:
        env["TENSORBOARD_DIR"] = environ.get("TENSORBOARD_DIR", str(output / "tensorboard"))
    if "wandb" in targets:
        env["WANDB_DIR"] = environ.get("WANDB_DIR", str(output))  # W&B adds its own wandb/ folder
    if "mlflow" in targets:
        env["MLFLOW_TRACKING_URI"] = environ.get("MLFLOW_TRACKING_URI", f"sqlite:///{output / 'mlflow.db'}")
    return env
