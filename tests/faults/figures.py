"""Each fault case's measured figure, printed at the end of the run (and copied into the table of
docs/reliability/faults.md)."""

from __future__ import annotations

FIGURES: list[tuple[str, str]] = []


def report(case: str, figure: str) -> None:
    FIGURES.append((case, figure))
    print(f"[fault] {case}: {figure}")
