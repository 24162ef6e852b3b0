"""Where AGL's code runs from: the folder that holds the `services` package, and whether it is a checkout.

A checkout (pyproject.toml beside services/) puts itself on the PYTHONPATH of the processes it starts (its services,
the engine's own interpreter, the trainer), as the images put their copy of the code on theirs. An installed AGL's
interpreter finds the package by itself, and another interpreter (the engine's) must not be given its site-packages.
"""

from __future__ import annotations

from pathlib import Path

SOURCE_ROOT = Path(__file__).resolve().parents[1]
CHECKOUT: Path | None = SOURCE_ROOT if (SOURCE_ROOT / "pyproject.toml").is_file() else None
