"""Counts of fuzz cases tried and failed, per RPC or route, printed at the end of the run (the fuzz totals of
docs/reliability/faults.md)."""

from __future__ import annotations

from collections import Counter

TRIED: Counter[str] = Counter()
FAILED: Counter[str] = Counter()
ANSWERS: dict[str, Counter[str]] = {}  # target -> answers by class ("2xx", "4xx", "OK", "INVALID_ARGUMENT", ...)


def tried(target: str, answer: str = "") -> None:
    TRIED[target] += 1
    if answer:
        ANSWERS.setdefault(target, Counter())[answer] += 1


def lines() -> list[str]:
    if not TRIED:
        return []
    width = max(len(name) for name in TRIED)
    rows = []
    for name in sorted(TRIED):
        answers = " ".join(f"{kind} {count}" for kind, count in sorted(ANSWERS.get(name, {}).items()))
        rows.append(f"{name:<{width}}  tried {TRIED[name]:>5}  failures {FAILED[name]}  ({answers})")
    total = f"{'total':<{width}}  tried {sum(TRIED.values()):>5}  failures {sum(FAILED.values())}"
    return [*rows, total]
