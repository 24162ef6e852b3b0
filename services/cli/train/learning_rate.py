"""The default learning rate of `agl train`, from the model's size.

One rate does not fit every model: 1e-6, usual for GRPO on 7B models, leaves a 1 M-parameter model where it was
(issue 43: the demo's trained model as --model moved nothing in five steps), and 1e-4, what the tiny model takes,
breaks a billion-parameter one. Updates scale with width, so the rate goes as one over the square root of the
parameter count: 1e-4 at 1 M parameters (the tiny model's rate), 4.5e-6 at 0.5 B, 1.2e-6 at 7 B, held within
[1e-6, 1e-4]. A LoRA run gets ten times that: only the small adapter moves, and its B matrices start at zero.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

HIGHEST, LOWEST = 1e-4, 1e-6
REFERENCE_PARAMETERS = 1e6  # the size that gets HIGHEST
LORA_FACTOR = 10.0


def parameter_count(model_dir: Path) -> int | None:
    """Parameters in the model's safetensors files (their headers only: no weights are read); None without them."""
    total = 0
    files = sorted(model_dir.glob("*.safetensors"))
    for path in files:
        with path.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
        for name, entry in header.items():
            if name != "__metadata__":
                total += math.prod(entry.get("shape", []))
    return total or None


def default_lr(parameters: int | None, *, lora: bool = False) -> float:
    """None (the size is unknown: weights not in safetensors) takes the lowest rate, the safe side."""
    if parameters is None:
        rate = LOWEST
    else:
        rate = min(HIGHEST, max(LOWEST, HIGHEST * math.sqrt(REFERENCE_PARAMETERS / parameters)))
    return rate * LORA_FACTOR if lora else rate
