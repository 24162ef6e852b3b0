"""Counts of fuzz cases tried and failed, per RPC or route, printed at the end of the run (README's fuzz totals)."""

from __future__ import annotations

from collections import Counter

TRIED: Counter[str] = Counter()
FAILED: Counter[str] = Counter()


def tried(target: str) -> None:
    TRIED[target] += 1


def lines() -> list[str]:
    if not TRIED:
        return []
    width = max(len(name) for name in TRIED)
    rows = [f"{name:<{width}}  tried {TRIED[name]:>5}  failures {FAILED[name]}" for name in sorted(TRIED)]
    total = f"{'total':<{width}}  tried {sum(TRIED.values()):>5}  failures {sum(FAILED.values())}"
    return [*rows, total]
