"""`agl runs` and `agl run ID`: training runs and their step metrics as tables."""

from __future__ import annotations

import argparse

from services._gen.agl.v1 import run_pb2
from services.client import LedgerClient

from . import render
from .errors import USAGE, CliError
from .labels import parse_labels

# Shown by default when a run has them (in this order), up to MAX_COLUMNS; --metric picks others.
PREFERRED = (
    "agl/reward/mean",
    "critic/score/mean",
    "critic/rewards/mean",
    "agl/reward_mean",
    "val/agl/reward_mean",
    "agl/rollout/succeeded",
    "agl/rollout/failed",
    "agl/step/seconds",
    "timing_s/step",
    "timing_s/gen",
)
MAX_COLUMNS = 6
# Steps shown by --health when --last is not given.
HEALTH_STEPS = 10


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("runs", help="list training runs")
    add_from_option(p)
    p.add_argument(
        "--local",
        action="store_true",
        help="the runs of agl train under agl-runs/ here, from their folders: state, last step, whether running",
    )
    p.add_argument("--state", action="append", default=[], choices=sorted(render.RUN_STATES))
    p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=list_runs)

    p = sub.add_parser("run", help="one run: its steps and metrics as a table")
    p.add_argument("run_id")
    add_from_option(p)
    p.add_argument("--metric", action="append", default=[], help="a metric column (repeatable); default a few")
    p.add_argument("--all-metrics", action="store_true", help="every metric, one line per step and metric")
    p.add_argument("--last", type=int, default=0, help="only the last N steps")
    p.add_argument(
        "--health",
        action="store_true",
        help=f"the step health table (agl/health/* by step, marked over the run's limits; last {HEALTH_STEPS} "
        "steps unless --last)",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=show_run)


def add_from_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--from",
        dest="from_dir",
        metavar="DIR",
        help="read a finished run's stored ledger: its folder (agl-runs/RUN, demo-output) or run id",
    )


async def list_runs(client: LedgerClient, args: argparse.Namespace) -> int:
    runs = await client.list_runs(parse_labels(args.label), [render.RUN_STATES[s] for s in args.state])
    if args.json:
        print(render.dumps({"runs": [render.as_dict(r) for r in runs]}))
        return 0
    rows = [
        (
            r.run_id,
            render.run_state(r.state),
            str(r.step_count),
            str(r.last_step),
            render.when(r.create_time),
            render.when(r.update_time),
            " ".join(f"{k}={v}" for k, v in sorted(r.labels.items())) or "-",
        )
        for r in runs
    ]
    print(render.table(("RUN", "STATE", "STEPS", "LAST", "CREATED", "UPDATED", "LABELS"), rows))
    return 0


def columns(steps: list[run_pb2.RunStep], wanted: list[str]) -> list[str]:
    if wanted:
        return wanted
    present: dict[str, None] = {}
    for step in steps:
        present.update(dict.fromkeys(step.metrics))
    chosen = [name for name in PREFERRED if name in present]
    for name in sorted(present):
        if len(chosen) >= MAX_COLUMNS:
            break
        if name not in chosen:
            chosen.append(name)
    return chosen[:MAX_COLUMNS]


async def show_run(client: LedgerClient, args: argparse.Namespace) -> int:
    if args.last < 0:
        raise CliError("--last must not be negative", USAGE)
    run = await client.get_run(args.run_id)
    # --health shows every health metric: a --metric filter would hide them.
    steps = await client.list_run_steps(args.run_id, metric_names=[] if args.health else args.metric)
    if args.health:
        return _show_health(run, steps[-(args.last or HEALTH_STEPS) :], args.json)
    if args.last:
        steps = steps[-args.last :]
    if args.json:
        print(render.dumps({"run": render.as_dict(run), "steps": [render.as_dict(s) for s in steps]}))
        return 0
    print(
        f"run {run.run_id}  {render.run_state(run.state)}  {run.step_count} steps  "
        f"created {render.when(run.create_time)}  updated {render.when(run.update_time)}"
    )
    if run.error_message:
        print(f"error: {run.error_message}")
    if run.labels:
        print("labels " + " ".join(f"{k}={v}" for k, v in sorted(run.labels.items())))
    if run.config_json:
        print(f"config {render.single_line(run.config_json, 200)}")
    if not steps:
        print("(no steps reported)")
        return 0
    if args.all_metrics:
        rows = [(str(s.step), name, render.number(v)) for s in steps for name, v in sorted(s.metrics.items())]
        print(render.table(("STEP", "METRIC", "VALUE"), rows))
        return 0
    names = columns(steps, args.metric)
    rows = [
        (
            str(s.step),
            render.when(s.create_time),
            *(_cell(s, n) for n in names),
        )
        for s in steps
    ]
    print(render.table(("STEP", "TIME", *names), rows))
    return 0


def _show_health(run: run_pb2.Run, steps: list[run_pb2.RunStep], as_json: bool) -> int:
    limits = render.health_limits(run.config_json)
    if as_json:
        rows = []
        for s in steps:
            health = {n: v for n, v in sorted(s.metrics.items()) if n.startswith(render.HEALTH_PREFIX)}
            over = {n: level for n, v in health.items() if (level := render.over_limit(v, limits.get(n)))}
            rows.append({"step": s.step, "metrics": health, "over": over})
        limits_out = {n: {"warn": w, "stop": s} for n, (w, s) in limits.items()}
        print(render.dumps({"run_id": run.run_id, "state": render.run_state(run.state), "limits": limits_out,
                            "steps": rows}))  # fmt: skip
        return 0
    print(f"run {run.run_id}  {render.run_state(run.state)}  {run.step_count} steps")
    if run.error_message:
        print(f"error: {run.error_message}")
    print(render.health_table(steps, limits) if steps else "(no steps reported)")
    return 0


def _cell(step: run_pb2.RunStep, name: str) -> str:
    return render.number(step.metrics[name]) if name in step.metrics else "-"
