"""What each page shows, built from the mirror (and, for one rollout or one run, a few ledger reads)."""

from __future__ import annotations

import asyncio
import datetime
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from services._gen.agl.v1 import rollout_pb2, run_pb2

from . import charts, training
from .mirror import Mirror
from .transcript import reward_of, transcript

LABEL_RUN, LABEL_STEP, LABEL_GROUP = "agl_run", "agl_step", "agl_group"
STATES = ("queuing", "running", "succeeded", "failed")
# The reward curve: the first of these a run reports.
REWARD_METRICS = ("agl/reward/mean", "critic/score/mean", "agl/reward_mean", "critic/rewards/mean")
# The held-out reward: the first of these a run reports (the trainer's own, then verl's names under val/).
VAL_REWARD_METRICS = ("val/agl/reward_mean", *(f"val/{name}" for name in REWARD_METRICS))
# Metrics AGL and verl write; any other name is the user's own (charted by default, after the held-out reward).
SYSTEM_PREFIXES = ("agl/", "critic/", "actor/", "timing_s/", "timing_per_token_ms/", "perf/", "response_length/",
                   "prompt_length/", "training/", "global_seqlen/", "response/", "prompt/", "val-aux/",
                   "val-core/")  # fmt: skip
# Charts besides the reward curve when the page is opened without a choice (?chart=NAME picks others).
MAX_VAL_CHARTS = 4
MAX_GROUP_ROLLOUTS = 256


def state_name(value: int) -> str:
    return rollout_pb2.RolloutState.Name(value).removeprefix("ROLLOUT_STATE_").lower()


def run_state_name(value: int) -> str:
    return run_pb2.RunState.Name(value).removeprefix("RUN_STATE_").lower()


def when(ts: Any) -> str:
    if not ts.seconds:
        return "-"
    return datetime.datetime.fromtimestamp(ts.seconds, tz=datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def duration(start: Any, end: Any) -> str:
    if not start.seconds or not end.seconds:
        return "-"
    return f"{(end.seconds - start.seconds) + (end.nanos - start.nanos) / 1e9:.2f}s"


def overview(mirror: Mirror) -> dict[str, Any]:
    control = mirror.proxy
    replicas = [
        {
            "id": r.replica_id,
            "in_flight": r.in_flight,
            "applied": r.observed_generation >= control.generation,
            "reported": when(r.report_time),
        }
        for r in control.replicas
    ]
    runs = sorted(mirror.runs.values(), key=lambda r: (r.update_time.seconds, r.update_time.nanos), reverse=True)
    return {
        "counts": mirror.count_by_state(),
        "total": len(mirror.rollouts),
        "models": [
            {"name": e.model_name, "endpoint": e.endpoint, "version": e.version, "updated": when(e.update_time)}
            for e in mirror.models
        ],
        "proxy": {
            "paused": control.paused,
            "reason": control.reason,
            "generation": control.generation,
            "retry_after": control.retry_after_seconds,
        },
        # A run's pause around its own weight update holds only the calls routed to its model (model_routes.py).
        "model_pauses": [
            {"model": p.model_name, "reason": p.reason, "owner": p.owner, "retry_after": p.retry_after_seconds}
            for p in sorted(control.model_pauses, key=lambda p: p.model_name)
        ],
        "replicas": replicas,
        "runs": [_run_row(r) for r in runs[:10]],
    }


def _run_row(run: run_pb2.Run) -> dict[str, Any]:
    return {
        "id": run.run_id,
        "state": run_state_name(run.state),
        "steps": run.step_count,
        "last_step": run.last_step,
        "created": when(run.create_time),
        "updated": when(run.update_time),
        "labels": " ".join(f"{k}={v}" for k, v in sorted(run.labels.items())),
        "error": run.error_message,
    }


def runs(mirror: Mirror) -> dict[str, Any]:
    ordered = sorted(mirror.runs.values(), key=lambda r: (r.create_time.seconds, r.create_time.nanos), reverse=True)
    return {"runs": [_run_row(r) for r in ordered]}


def rollout_rows(mirror: Mirror, query: Mapping[str, str], page_size: int) -> dict[str, Any]:
    """A page of the newest matching rollouts. Filters: state, run, label (KEY=VALUE); page (from 1)."""
    state = query.get("state", "")
    run = query.get("run", "")
    label = query.get("label", "")
    key, _, value = label.partition("=")
    try:
        page = max(int(query.get("page", "1")), 1)
    except ValueError:
        page = 1
    wanted = STATES.index(state) + 1 if state in STATES else 0
    skip = (page - 1) * page_size
    rows: list[dict[str, Any]] = []
    more = False
    for rollout in reversed(mirror.rollouts.values()):
        status = rollout.status
        if wanted and status.state != wanted:
            continue
        labels = rollout.metadata.labels
        if run and labels.get(LABEL_RUN) != run:
            continue
        if key and labels.get(key) != value:
            continue
        if skip:
            skip -= 1
            continue
        if len(rows) == page_size:
            more = True
            break
        rows.append(
            {
                "id": rollout.rollout_id,
                "state": state_name(status.state),
                "run": labels.get(LABEL_RUN, ""),
                "step": labels.get(LABEL_STEP, ""),
                "group": labels.get(LABEL_GROUP, ""),
                "created": when(status.create_time),
                "duration": duration(status.start_time, status.end_time),
                "error": status.error_message[:120],
            }
        )
    return {
        "rows": rows,
        "filters": {"state": state if wanted else "", "run": run, "label": label},
        "page": page,
        "more": more,
        "states": STATES,
    }


async def rollout_detail(mirror: Mirror, rollout_id: str, tokens: bool) -> dict[str, Any]:
    rollout = await mirror.client.get_rollout(rollout_id)
    status = rollout.status
    events = await mirror.client.list_events(rollout_id) if status.attempt_id else []
    return {
        "id": rollout.rollout_id,
        "state": state_name(status.state),
        "attempt": status.attempt_id,
        "created": when(status.create_time),
        "started": when(status.start_time),
        "ended": when(status.end_time),
        "duration": duration(status.start_time, status.end_time),
        "error": status.error_message,
        "launcher": status.launcher_ref,
        "controller": status.controller_id,
        "labels": sorted(rollout.metadata.labels.items()),
        "input": rollout.input_json,
        "is_train": rollout.is_train,
        "items": [i for i in transcript(events) if i.event_type != training.ROWS_EVENT],
        "reward": reward_of(events),
        "tokens": tokens,
        "training": training.training_records(events),
        "run_id": rollout.metadata.labels.get(LABEL_RUN, ""),
    }


def _series(steps: list[run_pb2.RunStep], name: str) -> list[tuple[int, float]]:
    return [(s.step, s.metrics[name]) for s in steps if name in s.metrics]


def users_metric(name: str) -> bool:
    """A metric the user's agent or config made, not one AGL or verl writes (a val/ copy of either included)."""
    bare = name.removeprefix("val/")
    return not bare.startswith(SYSTEM_PREFIXES) and bare not in REWARD_METRICS


def default_charts(names: Sequence[str]) -> list[str]:
    """The metrics charted when the user chose none: the held-out reward first, then the user's own metrics
    (validation's before training's), MAX_VAL_CHARTS in all."""
    held_out = next((n for n in VAL_REWARD_METRICS if n in names), None)
    own = sorted((n for n in names if users_metric(n)), key=lambda n: (not n.startswith("val/"), n))
    return [*([held_out] if held_out else []), *own][:MAX_VAL_CHARTS]


async def run_detail(mirror: Mirror, run_id: str, chosen: Sequence[str] = ()) -> dict[str, Any]:
    """chosen: the metrics to chart besides the reward (?chart=NAME, repeated); none: default_charts."""
    run = await mirror.client.get_run(run_id)
    steps = await mirror.client.list_run_steps(run_id)
    names: dict[str, None] = {}
    for step in steps:
        names.update(dict.fromkeys(step.metrics))
    reward_name = next((n for n in REWARD_METRICS if n in names), "")
    picked = [n for n in dict.fromkeys(chosen) if n in names]
    val_names = picked or default_charts(list(names))
    chart_list = [charts.line_chart(f"reward: {reward_name}" if reward_name else "reward", _series(steps, reward_name))]
    chart_list += [charts.line_chart(n, _series(steps, n)) for n in val_names]
    latest = steps[-1] if steps else None
    timing = sorted(
        (
            (n.removeprefix("timing_s/"), v)
            for n, v in (latest.metrics.items() if latest else ())
            if n.startswith("timing_s/")
        ),
        key=lambda item: -item[1],
    )
    return {
        "run": _run_row(run),
        "config": run.config_json,
        "charts": chart_list,
        "charted": val_names,
        "metric_names": sorted(n for n in names if n != reward_name),
        "timing": charts.bars(f"time per phase, step {latest.step}" if latest else "time per phase", timing),
        "latest": sorted(latest.metrics.items()) if latest else [],
        "latest_step": latest.step if latest else None,
        "groups": await _groups(mirror, run_id),
        "health": training.health_table(steps, run.config_json),
    }


async def health_rollouts(mirror: Mirror, run_id: str, step: int, metric: str) -> dict[str, Any]:
    """The rollouts of a run's step that count in a health metric, as the trainer recorded them (their
    agl_training_rows event); only rollouts the ledger still keeps (agl.retention.keep_steps) can be listed."""
    short = metric.removeprefix(training.HEALTH_PREFIX)
    candidates = [
        r
        for r in mirror.rollouts.values()
        if r.metadata.labels.get(LABEL_RUN) == run_id and r.metadata.labels.get(LABEL_STEP) == str(step)
    ][:MAX_GROUP_ROLLOUTS]

    async def record(rollout: rollout_pb2.Rollout) -> training.Training | None:
        if not rollout.status.attempt_id:
            return None
        events = await mirror.client.list_events(rollout.rollout_id, event_type=training.ROWS_EVENT)
        return next((t for t in training.training_records(events) if t.step == step), None)

    records = await asyncio.gather(*(record(r) for r in candidates))
    shown = [
        {
            "id": r.rollout_id,
            "state": state_name(r.status.state),
            "reward": t.reward,
            "advantage": t.advantage,
            "left_out": t.left_out,
            "error": r.status.error_message[:160],
        }
        for r, t in zip(candidates, records, strict=True)
        if t is not None and short in t.flags
    ]
    return {
        "run_id": run_id,
        "step": step,
        "metric": training.HEALTH_PREFIX + short,
        "rollouts": shown,
        "recorded": sum(1 for t in records if t is not None),
        "stored": len(candidates),
    }


async def _groups(mirror: Mirror, run_id: str) -> dict[str, Any]:
    """The latest step's rollouts still in the ledger, by group, with rewards and advantages. The advantage is the
    one the trainer used for the rollout's rows, as it recorded it (agl_training_rows): the same number the rollout
    page and the health page show; None where the trainer recorded none (not consumed yet, or left out)."""
    rollouts = [r for r in mirror.rollouts.values() if r.metadata.labels.get(LABEL_RUN) == run_id]
    steps = [int(s) for s in {r.metadata.labels.get(LABEL_STEP, "") for r in rollouts} if s.isdigit()]
    if not steps:
        return {"step": None, "groups": []}
    step = max(steps)
    chosen = [r for r in rollouts if r.metadata.labels.get(LABEL_STEP) == str(step)][:MAX_GROUP_ROLLOUTS]

    async def scored(rollout: rollout_pb2.Rollout) -> tuple[float | None, float | None]:
        if not rollout.status.attempt_id:
            return None, None
        rewards, rows = await asyncio.gather(
            mirror.client.list_events(rollout.rollout_id, event_type="reward"),
            mirror.client.list_events(rollout.rollout_id, event_type=training.ROWS_EVENT),
        )
        record = next((t for t in training.training_records(rows) if t.step == step), None)
        return reward_of(rewards), None if record is None else record.advantage

    results = await asyncio.gather(*(scored(r) for r in chosen))
    grouped: dict[str, list[tuple[rollout_pb2.Rollout, float | None, float | None]]] = {}
    for rollout, (value, advantage) in zip(chosen, results, strict=True):
        grouped.setdefault(rollout.metadata.labels.get(LABEL_GROUP, "-"), []).append((rollout, value, advantage))
    groups = []
    for name, members in sorted(grouped.items()):
        known = [v for _, v, _ in members if v is not None]
        groups.append(
            {
                "name": name,
                "mean": statistics.fmean(known) if known else None,
                "members": [
                    {"id": r.rollout_id, "state": state_name(r.status.state), "reward": v, "advantage": a}
                    for r, v, a in members
                ],
            }
        )
    return {"step": step, "groups": groups}
