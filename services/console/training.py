"""What the trainer made of a rollout, and a run's step health, for the pages (pure: no I/O).

The trainer records each consumed rollout's training rows as an `agl_training_rows` event (its JSON is described
in services/trainer/data/row_records.py) and the health limits in the run's config summary (`health_limits`); both
are read here as data, so the console needs neither the trainer's code nor a tokenizer.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from services._gen.agl.v1 import event_pb2, run_pb2
from services.cli.render import over_limit  # the trainer's rule, shared with `agl run --health`

ROWS_EVENT = "agl_training_rows"
HEALTH_PREFIX = "agl/health/"
MAX_HEALTH_STEPS = 12


@dataclass
class Token:
    text: str
    id: int
    generated: bool
    engine: float | None
    trainer: float | None


@dataclass
class TrainingRow:
    segment: int
    segments: int
    first_turn: int
    turns: int
    # The calls merged into the row (0-based): not consecutive where conversations interleave.
    turn_indices: list[int]
    break_before: bool
    trained: bool
    prompt_tokens: int
    tokens: list[Token]

    @property
    def turn_label(self) -> str:
        """The row's calls, 1-based: "3", a run "1-4", or a list "1, 3, 5" where another conversation's calls came
        between them."""
        turns = [i + 1 for i in self.turn_indices] or [self.first_turn + 1]
        if turns == list(range(turns[0], turns[0] + len(turns))):
            return f"{turns[0]}-{turns[-1]}" if len(turns) > 1 else str(turns[0])
        return ", ".join(str(t) for t in turns)

    @property
    def gap(self) -> float | None:
        """The largest engine/trainer log-prob gap on the row's generated tokens (None: no recomputation kept)."""
        gaps = [abs(t.engine - t.trainer) for t in self.tokens if t.generated and None not in (t.engine, t.trainer)]
        return max(gaps) if gaps else None


@dataclass
class Training:
    step: int
    reward: float | None
    advantage: float | None
    kept: bool
    left_out: str
    flags: list[str]
    rows: list[TrainingRow] = field(default_factory=list)


def _at(values: Any, index: int) -> float | None:
    if not isinstance(values, list) or index >= len(values) or values[index] is None:
        return None
    return float(values[index])


def _turn_indices(raw: dict[str, Any]) -> list[int]:
    """The row's calls; records written before they were kept had consecutive ones only."""
    given = raw.get("turn_indices")
    if isinstance(given, list) and all(isinstance(i, int) for i in given):
        return list(given)
    first = int(raw.get("first_turn", 0))
    return list(range(first, first + int(raw.get("turns", 1))))


def training_records(events: Sequence[event_pb2.Event]) -> list[Training]:
    """The rollout's training-row records in step order; malformed ones are skipped."""
    out: list[Training] = []
    for event in events:
        if event.event_type != ROWS_EVENT or event.WhichOneof("payload") != "data_json":
            continue
        try:
            data = json.loads(event.data_json)
        except ValueError:
            continue
        if not isinstance(data, dict):
            continue
        rows = []
        for raw in data.get("rows") or []:
            ids, mask, texts = raw.get("ids") or [], raw.get("mask") or [], raw.get("tokens") or []
            tokens = [
                Token(
                    text=str(texts[i]) if i < len(texts) else "",
                    id=int(token_id),
                    generated=bool(mask[i]) if i < len(mask) else False,
                    engine=_at(raw.get("engine_logprobs"), i),
                    trainer=_at(raw.get("trainer_logprobs"), i),
                )
                for i, token_id in enumerate(ids)
            ]
            rows.append(
                TrainingRow(
                    segment=int(raw.get("segment", 0)),
                    segments=int(raw.get("segments", 1)),
                    first_turn=int(raw.get("first_turn", 0)),
                    turns=int(raw.get("turns", 1)),
                    turn_indices=_turn_indices(raw),
                    break_before=bool(raw.get("break_before")),
                    trained=bool(raw.get("trained")),
                    prompt_tokens=int(raw.get("prompt_tokens", 0)),
                    tokens=tokens,
                )
            )
        out.append(
            Training(
                step=int(data.get("step", 0)),
                reward=data.get("reward"),
                advantage=data.get("advantage"),
                kept=bool(data.get("kept", True)),
                left_out=str(data.get("left_out", "")),
                flags=[str(f) for f in data.get("flags") or []],
                rows=rows,
            )
        )
    return sorted(out, key=lambda t: t.step)


def health_limits(config_json: str) -> dict[str, tuple[float | None, float | None]]:
    try:
        config = json.loads(config_json) if config_json else {}
    except ValueError:
        return {}
    raw = config.get("health_limits") if isinstance(config, dict) else None
    if not isinstance(raw, dict):
        return {}
    return {n: (v.get("warn"), v.get("stop")) for n, v in raw.items() if isinstance(v, dict)}


def health_table(steps: Sequence[run_pb2.RunStep], config_json: str) -> dict[str, Any]:
    """The last steps' health metrics, each cell with its level; the steps with a value over a limit."""
    steps = [s for s in steps if any(n.startswith(HEALTH_PREFIX) for n in s.metrics)][-MAX_HEALTH_STEPS:]
    limits = health_limits(config_json)
    names: dict[str, None] = {}
    for step in steps:
        names.update(dict.fromkeys(sorted(n for n in step.metrics if n.startswith(HEALTH_PREFIX))))
    rows = []
    flagged: dict[int, str] = {}
    for name in names:
        limit = limits.get(name)
        cells = []
        for step in steps:
            value = step.metrics.get(name)
            mark = over_limit(value, limit) if value is not None else ""
            if mark == "stop" or (mark == "warn" and step.step not in flagged):
                flagged[step.step] = mark
            cells.append({"step": step.step, "value": value, "level": mark})
        rows.append({"name": name, "short": name.removeprefix(HEALTH_PREFIX), "limit": limit, "cells": cells})
    return {"steps": [s.step for s in steps], "rows": rows, "flagged": flagged}
