"""Guardrails: limits on step health that warn, and stop the run loudly instead of training on garbage.

Pure (stdlib logging only). Each health metric (trainer/data/step_health.py) may have a warning limit and a stop
limit (`agl.health.limits.<name>.warn` / `.stop`; null: none); a value above the warning limit logs one line per
step, a value above the stop limit ends the run with one line naming the metric, its value, the limit and the
rollouts that show it. A share counted over fewer than `min_count` items (rollouts, calls, tool calls, rows:
`agl.health.min_count`, default 8) never stops the run: three bad tool calls of four are noise, not evidence; over
its stop limit it warns instead. One stop needs no limit: a step in which every rollout failed ends the run with the
first agent error as the ledger recorded it (rollout id, reason, the controller's message with the agent's log path).

Defaults (shares unless said): warn / stop

| metric | warn | stop |
|---|---|---|
| `rollouts_without_calls` | 0.1 | 0.5 |
| `succeeded_without_reward` | 0.1 | 0.5 |
| `reward_before_last_call` | 0 | 0.5 |
| `failed_calls` | 0.05 | 0.5 |
| `engine_unavailable_calls` | 0.05 | - (the rollouts that failed on them are infrastructure failures) |
| `truncated_calls` | 0.25 | - |
| `bad_tool_calls` | 0.2 | 0.9 |
| `failed_rollouts` | 0.25 | - (every rollout failed: always a stop) |
| `infra_failed_rollouts` | 0.1 | - |
| `trajectory_breaks` | 0.05 | 0.9 (a break costs a segment row, not correctness) |
| `dropped_rows` | 0.05 | 0.5 |
| `truncated_rows` | 0.25 | - |
| `masked_tokens` | - | - |
| `no_signal_groups` | - | - |
| `identical_reward_steps` | 3 | 10 (steps) |
| `logprob_gap` | 0.05 | 0.5 (nats) |
| `judge_failed_groups` | 0 | 0.5 (and a step whose every group the judge failed always stops) |
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from services.trainer.data import step_health as h
from services.trainer.data.triplets import RolloutTrace

log = logging.getLogger(__name__)

WARN = "warn"
STOP = "stop"


class HealthStop(RuntimeError):
    """The run stops: the message is the one line that says why."""


@dataclass(frozen=True)
class Limit:
    warn: float | None = None
    stop: float | None = None


DEFAULT_LIMITS: dict[str, Limit] = {
    h.ROLLOUTS_WITHOUT_CALLS: Limit(0.1, 0.5),
    h.SUCCEEDED_WITHOUT_REWARD: Limit(0.1, 0.5),
    h.REWARD_BEFORE_LAST_CALL: Limit(0.0, 0.5),
    h.FAILED_CALLS: Limit(0.05, 0.5),
    h.ENGINE_UNAVAILABLE_CALLS: Limit(0.05, None),
    h.TRUNCATED_CALLS: Limit(0.25, None),
    h.BAD_TOOL_CALLS: Limit(0.2, 0.9),
    h.FAILED_ROLLOUTS: Limit(0.25, None),
    h.INFRA_FAILED_ROLLOUTS: Limit(0.1, None),
    h.TRAJECTORY_BREAK_SHARE: Limit(0.05, 0.9),
    h.DROPPED_ROWS: Limit(0.05, 0.5),
    h.TRUNCATED_ROWS: Limit(0.25, None),
    h.MASKED_TOKENS: Limit(None, None),
    h.NO_SIGNAL_GROUPS: Limit(None, None),
    h.IDENTICAL_REWARD_STEPS: Limit(3, 10),
    h.LOGPROB_GAP: Limit(0.05, 0.5),
    h.JUDGE_FAILED_GROUPS: Limit(0.0, 0.5),
}


def _level(name: str, level: str, raw: Any) -> float | None:
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise ValueError(f"limits.{name}.{level}={raw!r}: a number or null")
    value = float(raw)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"limits.{name}.{level}={raw!r}: a finite number >= 0 or null")
    return value


def parse_limits(raw: Mapping[str, Any] | None) -> dict[str, Limit]:
    """The defaults with `raw` ({name: {warn, stop}}) over them; ValueError naming the key for anything wrong."""
    limits = dict(DEFAULT_LIMITS)
    for name, levels in (raw or {}).items():
        if name not in DEFAULT_LIMITS:
            raise ValueError(f"limits.{name}: not a health metric; known: {', '.join(DEFAULT_LIMITS)}")
        if not isinstance(levels, Mapping):
            raise ValueError(f"limits.{name}={levels!r}: give {{warn: X, stop: Y}} (null turns a level off)")
        unknown = sorted(set(levels) - {WARN, STOP})
        if unknown:
            raise ValueError(f"limits.{name}.{unknown[0]}: only warn and stop are limits")
        default = DEFAULT_LIMITS[name]
        warn = _level(name, WARN, levels[WARN]) if WARN in levels else default.warn
        stop = _level(name, STOP, levels[STOP]) if STOP in levels else default.stop
        if warn is not None and stop is not None and warn > stop:
            raise ValueError(f"limits.{name}: warn={warn:g} above stop={stop:g}; the warning level must be the lower")
        limits[name] = Limit(warn, stop)
    return limits


@dataclass(frozen=True)
class Breach:
    name: str
    level: str
    value: float
    limit: float
    line: str


def _rollout_list(ids: Sequence[str], most: int) -> str:
    if not ids:
        return ""
    shown = ", ".join(ids[:most])
    more = len(ids) - most
    return f"; rollouts: {shown}" + (f" and {more} more" if more > 0 else "")


def breach_line(
    step: int, prefix: str, name: str, level: str, limit: float, health: h.StepHealth, most: int, note: str = ""
) -> str:
    value = health.value(name)
    share = health.shares.get(name)
    amount = f" ({share.part:g} of {share.whole:g})" if share is not None else ""
    kind = "stop" if level == STOP else "warning"
    return (
        f"step {step}: {prefix}/{name}={value:.4g}{amount} over the {kind} limit {limit:g}{note}"
        f"{_rollout_list(health.rollouts(name), most)}"
    )


def evaluate(
    step: int,
    health: h.StepHealth,
    names: Iterable[str],
    limits: Mapping[str, Limit],
    *,
    prefix: str = h.TRAIN_PREFIX,
    most: int = 5,
    min_count: int = 1,
) -> list[Breach]:
    """The limits `names` pass (a value strictly above a limit), stops first; one breach per metric. A share over
    fewer than `min_count` items is over its stop limit as a warning only."""
    stops: list[Breach] = []
    warnings: list[Breach] = []
    for name in names:
        limit = limits.get(name)
        if limit is None:
            continue
        value = health.value(name)
        share = health.shares.get(name)
        if limit.stop is not None and value > limit.stop and share is not None and share.whole < min_count:
            note = f", but only {share.whole:g} counted (fewer than agl.health.min_count={min_count}): a warning"
            line = breach_line(step, prefix, name, STOP, limit.stop, health, most, note)
            warnings.append(Breach(name, WARN, value, limit.stop, line))
        elif limit.stop is not None and value > limit.stop:
            stops.append(
                Breach(name, STOP, value, limit.stop, breach_line(step, prefix, name, STOP, limit.stop, health, most))
            )
        elif limit.warn is not None and value > limit.warn:
            warnings.append(
                Breach(name, WARN, value, limit.warn, breach_line(step, prefix, name, WARN, limit.warn, health, most))
            )
    return [*stops, *warnings]


def all_failed_line(step: int, traces: Sequence[RolloutTrace], infra_reasons: Iterable[str]) -> str | None:
    """The stop line when every consumed rollout failed (None otherwise): the first agent failure (the first
    infrastructure one when all are), as the ledger recorded it."""
    if not traces or any(t.succeeded for t in traces):
        return None
    infra = frozenset(infra_reasons)
    first = next((t for t in traces if t.failure_reason not in infra), traces[0])
    reason = first.failure_reason or "UNSPECIFIED"
    message = first.error_message or "no error message recorded"
    return (
        f"step {step}: every rollout failed ({len(traces)} of {len(traces)}); first: rollout {first.rollout_id} "
        f"({reason}): {message}"
    )


def judge_failed_line(step: int, failed: Sequence[tuple[str, Sequence[str], str]], groups: int) -> str | None:
    """The stop line when the judge could score none of the step's `groups` ((group id, rollout ids, why) each; None
    otherwise): the step has nothing to train on, and the judge's endpoint is the likely cause."""
    if not groups or len(failed) < groups:
        return None
    group_id, ids, why = failed[0]
    return (
        f"step {step}: the judge scored no group ({len(failed)} of {groups} failed); first: group {group_id}: {why}"
        f"{_rollout_list(list(ids), 5)}"
    )


@dataclass
class Guardrails:
    """The run's limits and what carries from step to step (the identical-reward streak)."""

    limits: Mapping[str, Limit]
    most_rollouts: int = 5
    min_count: int = 8
    identical_steps: int = 0

    def enforce(self, step: int, health: h.StepHealth, names: Iterable[str]) -> int:
        """Logs each warning; raises HealthStop with the first stop's line. Returns the number of warnings."""
        breaches = evaluate(step, health, names, self.limits, most=self.most_rollouts, min_count=self.min_count)
        if breaches and breaches[0].level == STOP:
            raise HealthStop(breaches[0].line)
        for breach in breaches:
            log.warning("health warning: %s", breach.line)
        return len(breaches)

    def describe(self, prefix: str = h.TRAIN_PREFIX) -> dict[str, dict[str, float | None]]:
        """The limits by full metric name, for the run's record (`agl run ID --health` and the console read it)."""
        return {f"{prefix}/{name}": {WARN: limit.warn, STOP: limit.stop} for name, limit in self.limits.items()}
