"""The check that scores a harness's run: the recipe's one task-specific part, to be replaced by your own.

This one fits the arithmetic tasks of examples/data (`{"question": "What is 6 * 7?", "answer": "42"}`): 1.0 when
the number the harness wrote into `answer.txt` in its workspace, or else the last number of its final message,
equals the expected answer; otherwise 0.0. A check for a coding task would run the task's tests in the workspace
instead. It runs after the harness has exited, in the same process as the recipe, and returns (reward, reason).
"""

from __future__ import annotations

import re
from pathlib import Path

ANSWER_FILE = "answer.txt"
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def last_number(text: str) -> float | None:
    found = _NUMBER.findall(text.replace(",", ""))
    return float(found[-1]) if found else None


def score(workspace: Path, final_text: str, expected: str) -> tuple[float, str]:
    """(reward, reason) of a finished run."""
    want = last_number(expected)
    if want is None:
        return 0.0, f"no expected number in the task's answer {expected!r}"
    answer_file = workspace / ANSWER_FILE
    if answer_file.is_file():
        source, text = ANSWER_FILE, answer_file.read_text(errors="replace")
    else:
        source, text = "final message", final_text
    got = last_number(text)
    if got is None:
        return 0.0, f"no number in the {source}"
    if abs(got - want) <= 1e-6 * max(1.0, abs(want)):
        return 1.0, f"{source}: {got:g} is right"
    return 0.0, f"{source}: {got:g}, expected {want:g}"
