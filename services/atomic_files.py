"""Folders replaced whole: written beside their place under another name, then renamed into it, so a reader (an
engine loading weights, `agl export`, a resumed trainer) sees the old folder or the new one, never a mix. Shared by
the trainer (its best weights) and the CLI (exported models and adapters)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def replace_dir(partial: Path, target: Path) -> None:
    """partial (written whole) becomes target, whose old contents go."""
    if target.exists():
        old = target.with_name(f".{target.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(target, old)
        os.replace(partial, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(partial, target)
