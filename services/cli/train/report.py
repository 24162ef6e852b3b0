"""What a training run shows: one line per step (with a progress bar and the time left), the summary at the end
and the reward curve, all from verl's file logger records ({"step": N, "data": {metric: value}})."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO


def read_metrics(path: Path, offset: int) -> tuple[list[dict[str, Any]], int]:
    """Complete JSON lines appended to verl's file logger since offset."""
    if not path.exists():
        return [], offset
    with path.open("rb") as source:
        source.seek(offset)
        chunk = source.read()
    end = chunk.rfind(b"\n") + 1
    records = [json.loads(line) for line in chunk[:end].splitlines() if line.strip()]
    return records, offset + end


# A health warning as the trainer logs it (services/trainer/data/guardrails.py, breach_line): "health warning: step 5:
# agl/health/truncated_calls=0.9688 (31 of 32) over the warning limit 0.25; rollouts: ...".
_WARNING = re.compile(r"health warning: step (\d+): (?:val/)?agl/health/(\w+=\S+(?: \([^)]*\))?) over the")


class TrainerWarnings:
    """The health warnings of each step, read from the trainer's log as it grows (a step's warnings are logged
    before its metrics record is written)."""

    def __init__(self, log: Path) -> None:
        """Reads what the log gets from now on: the log of a resumed run holds the warnings of earlier launches,
        whose step numbers come again."""
        self.log = log
        self.offset = log.stat().st_size if log.exists() else 0
        self.by_step: dict[int, list[str]] = {}

    def read(self) -> dict[int, list[str]]:
        if self.log.exists():
            with self.log.open("rb") as source:
                source.seek(self.offset)
                chunk = source.read()
            end = chunk.rfind(b"\n") + 1
            self.offset += end
            for found in _WARNING.finditer(chunk[:end].decode(errors="replace")):
                self.by_step.setdefault(int(found.group(1)), []).append(found.group(2))
        return self.by_step


def forget_redone_steps(history: Path, first: Mapping[str, Any]) -> int:
    """Drops from the run's history the steps a resumed launch does again; how many records were dropped.

    `first` is the launch's first record. A launch resumed from the checkpoint of step K logs its start at step K
    (no "training/global_step" metric) or begins with step K+1: what the history has after that is a stopped
    launch's pass over steps that come again (one that was reported, not yet checkpointed)."""
    if not history.exists():
        return 0
    step = int(first["step"])
    redone = step if "training/global_step" in first.get("data", {}) else step + 1
    lines = history.read_text().splitlines()
    kept = [line for line in lines if line.strip() and int(json.loads(line)["step"]) < redone]
    if len(kept) != len(lines):
        history.write_text("".join(line + "\n" for line in kept))
    return len(lines) - len(kept)


def progress_bar(step: int, total: int, elapsed_s: float, width: int = 20) -> str:
    """`[#####.....] 5/20 eta 3m10s`: the time left from the mean step time so far."""
    done = max(0, min(step, total))
    filled = round(width * done / total) if total else width
    text = f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total}"
    if 0 < done < total:
        left = elapsed_s / done * (total - done)
        text += f" eta {int(left // 60)}m{int(left % 60):02d}s"
    return text


def step_line(
    record: Mapping[str, Any],
    total: int,
    *,
    multi_turn: bool = False,
    val_label: str = "held-out reward",
    elapsed_s: float | None = None,
    warnings: Sequence[str] = (),
) -> str:
    """One line per step (ending with a progress bar when elapsed_s is given); for a multi-turn agent a second one
    with what its rollouts did: turns, tool calls (and those that did not parse), trajectory breaks and the
    context tokens masked in each row. warnings: the step's health warnings as the trainer logged them
    (TrainerWarnings), named on the line; without them the line gives their count."""
    data = record["data"]
    step = record["step"]

    def num(key: str, fmt: str = ".2f") -> str:
        value = data.get(key)
        return "-" if value is None else format(float(value), fmt)

    if step == 0 or "agl/reward/mean" not in data:  # the start of a launch: the first push and validation
        when = "before training" if step == 0 else f"resumed from the checkpoint of step {step}"
        line = f"step {step:>3}/{total}  "
        if "val/agl/reward_mean" in data:
            line += f"{val_label} {num('val/agl/reward_mean')} "
        line += f"({when})"
        if multi_turn:
            line += f", tool-call rate {num('val/agl/tools/call_rate')}"
        return line
    line = (
        f"step {step:>3}/{total}  reward {num('agl/reward/mean')}  "
        f"rollouts {num('timing_s/gen', '.1f')}s  update {num('timing_s/update_actor', '.2f')}s  "
        f"push {num('timing_s/update_weights', '.2f')}s  step {num('agl/step/seconds', '.1f')}s  "
        f"engine/trainer log-prob gap {num('agl/push/logprob_diff_max', '.1e')}"
    )
    if "val/agl/reward_mean" in data:
        line += f"  {val_label} {num('val/agl/reward_mean')}"
        if multi_turn:
            line += f" (tool-call rate {num('val/agl/tools/call_rate')})"
    count = data.get("agl/health/warnings")
    if warnings:
        line += f"  health warnings: {', '.join(warnings)}"
    elif count:
        line += f"  health warnings {int(count)} (in the trainer log)"
    if elapsed_s is not None:
        line += "  " + progress_bar(step, total, elapsed_s)
    if multi_turn:
        line += (
            f"\n          turns {num('agl/turns/mean')}  tool-call rate {num('agl/tools/call_rate')}"
            f"  tool calls unparsed {num('agl/tools/unparsed_calls', '.0f')}"
            f"  trajectory breaks {num('agl/data/trajectory_breaks', '.0f')}"
            f"  masked context tokens/row {num('agl/data/context_tokens_per_row', '.1f')}"
        )
    return line


# -- results ------------------------------------------------------------------------------------------------


TOOL_RATE, VAL_TOOL_RATE = "agl/tools/call_rate", "val/agl/tools/call_rate"


def draw_curve(records: Sequence[Mapping[str, Any]], path: Path, *, tools: bool = False) -> Path:
    """Training reward per step (line) and held-out accuracy (dots), drawn with Pillow; for an agent with tools
    also its tool-call rate in training (line) and on the held-out set (squares), in green."""
    from PIL import Image, ImageDraw

    width, height, margin = 720, 400, 50
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    steps = [r["step"] for r in records]
    last = max(steps, default=1) or 1

    def xy(step: float, value: float) -> tuple[float, float]:
        x = margin + (width - 2 * margin) * step / last
        y = height - margin - (height - 2 * margin) * max(0.0, min(1.0, value))
        return x, y

    draw.rectangle([margin, margin, width - margin, height - margin], outline="black")
    for tick in (0.0, 0.25, 0.5, 0.75, 1.0):
        _, y = xy(0, tick)
        draw.line([margin - 4, y, margin, y], fill="black")
        draw.text((8, y - 6), f"{tick:.2f}", fill="black")
    title = "AGL demo: training reward (blue) and held-out accuracy (red) by step"
    if tools:
        title += "; tool-call rate (green: training line, held-out squares)"
    draw.text((margin, 15), title, fill="black")
    for tick in sorted({0, last // 2, last}):
        x, _ = xy(tick, 0.0)
        draw.line([x, height - margin, x, height - margin + 4], fill="black")
        draw.text((x - 6, height - margin + 8), str(tick), fill="black")
    draw.text((width // 2 - 10, height - 22), "step", fill="black")
    train = [xy(r["step"], r["data"]["agl/reward/mean"]) for r in records if "agl/reward/mean" in r["data"]]
    if len(train) > 1:
        draw.line(train, fill=(40, 90, 200), width=2)
    for r in records:
        if "val/agl/reward_mean" in r["data"]:
            x, y = xy(r["step"], r["data"]["val/agl/reward_mean"])
            draw.ellipse([x - 5, y - 5, x + 5, y + 5], fill=(210, 40, 40))
    if tools:
        rate = [xy(r["step"], r["data"][TOOL_RATE]) for r in records if r["step"] > 0 and TOOL_RATE in r["data"]]
        if len(rate) > 1:
            draw.line(rate, fill=(30, 150, 60), width=2)
        for r in records:
            if VAL_TOOL_RATE in r["data"]:
                x, y = xy(r["step"], r["data"][VAL_TOOL_RATE])
                draw.rectangle([x - 4, y - 4, x + 4, y + 4], fill=(30, 150, 60))
    image.save(path)
    return path


SKIPPED = "agl/update/skipped_no_signal"


def summary(
    records: Sequence[Mapping[str, Any]],
    output_dir: Path,
    out: TextIO,
    *,
    tools: bool = False,
    val_label: str = "held-out greedy reward",
) -> dict[str, Any]:
    """Prints the results and draws the curve; returns the figures (before/after, steps trained and skipped)."""
    vals = [(r["step"], r["data"]["val/agl/reward_mean"]) for r in records if "val/agl/reward_mean" in r["data"]]
    rewards = [r["data"]["agl/reward/mean"] for r in records if "agl/reward/mean" in r["data"]]
    steps = [r["data"]["agl/step/seconds"] for r in records if "agl/step/seconds" in r["data"]]
    gaps = [r["data"]["agl/push/logprob_diff_max"] for r in records if "agl/push/logprob_diff_max" in r["data"]]
    skipped = sum(1 for r in records if r["step"] > 0 and r["data"].get(SKIPPED) == 1.0)
    result: dict[str, Any] = {"steps": len(rewards), "skipped_steps": skipped, "trained_steps": len(rewards) - skipped}
    out.write("\n== results ==\n")
    if vals:
        before, after = vals[0][1], vals[-1][1]
        result.update(before=before, after=after)
        out.write(f"{val_label:<28}{'before':>10}{'after':>10}{'change':>10}\n")
        out.write(f"{'':<28}{before:>10.3f}{after:>10.3f}{after - before:>+10.3f}\n")
    rates = [(r["step"], r["data"][VAL_TOOL_RATE]) for r in records if VAL_TOOL_RATE in r["data"]]
    if tools and rates:
        before_rate, after_rate = rates[0][1], rates[-1][1]
        result.update(tool_rate_before=before_rate, tool_rate_after=after_rate)
        line = f"{before_rate:>10.3f}{after_rate:>10.3f}{after_rate - before_rate:>+10.3f}"
        out.write(f"{'held-out tool-call rate':<28}{line}\n")
    if rewards:
        head, tail = rewards[: max(1, len(rewards) // 5)], rewards[-max(1, len(rewards) // 5) :]
        out.write(f"training reward: first steps {sum(head) / len(head):.3f}, last steps {sum(tail) / len(tail):.3f}\n")
    if skipped:
        out.write(
            f"steps without a learning signal (every reward of every group equal; the update was skipped): "
            f"{skipped} of {len(rewards)}\n"
        )
    if steps:
        ordered = sorted(steps)
        out.write(f"seconds per step: median {ordered[len(ordered) // 2]:.2f}, max {ordered[-1]:.2f}\n")
    if gaps:
        out.write(f"engine vs trainer log-probs after each push: max gap {max(gaps):.1e}\n")
    curve = draw_curve(records, output_dir / "reward_curve.png", tools=tools)
    out.write(f"reward curve: {curve}\nmetrics: {output_dir / 'metrics.jsonl'}\n")
    out.write(f"trajectories (decoded text): {output_dir / 'trajectories.jsonl'}\n")
    return result
