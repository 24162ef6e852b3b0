"""`agl rollouts`, `agl rollout ID`, `agl watch` and `agl enqueue FILE.jsonl`."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import uuid
from pathlib import Path

from services._gen.agl.v1 import rollout_pb2
from services.client import LedgerClient

from . import render
from .errors import USAGE, CliError
from .labels import parse_labels

LABEL_RUN = "agl_run"  # the trainer's labels (services/trainer/rollouts/specs.py)
LABEL_STEP = "agl_step"


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rollouts", help="list rollouts (filter by state, run, label; paged)")
    p.add_argument("--state", action="append", default=[], choices=sorted(render.ROLLOUT_STATES))
    p.add_argument("--run", help=f"only this run's rollouts (label {LABEL_RUN})")
    p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--page-size", type=int, default=50)
    p.add_argument("--page-token", default="")
    p.add_argument("--all", action="store_true", help="walk every page")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=list_rollouts)

    p = sub.add_parser("rollout", help="one rollout: its conversation, tool calls, timings and reward")
    p.add_argument("rollout_id")
    p.add_argument("--attempt", default="", help="an earlier attempt ('*': every attempt); default the latest")
    p.add_argument("--tokens", action="store_true", help="show token ids and log-probs of each call")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=show_rollout)

    p = sub.add_parser("watch", help="follow the terminal stream: rollouts as they finish (Ctrl-C stops)")
    p.add_argument("--run", help=f"only this run's rollouts (label {LABEL_RUN})")
    p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--after", type=int, default=None, help="resume after this cursor (0: from the start of the log)")
    p.add_argument("--limit", type=int, default=0, help="stop after this many rollouts (0: never)")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.set_defaults(handler=watch)

    p = sub.add_parser("enqueue", help="create one rollout per line of a JSONL file (each line is the input)")
    p.add_argument("file", help="JSONL file; '-' reads standard input")
    target = p.add_mutually_exclusive_group()
    target.add_argument("--agent-class", default="", help="module:Class run by the local runner")
    target.add_argument("--command", default="", help="command line run by the local runner (shell-quoted)")
    p.add_argument("--k8s-template", type=Path, help="Jinja2 Job template file for the Kubernetes runner")
    p.add_argument("--env-map", action="append", default=[], metavar="NAME=PATH", help="env var from an input field")
    p.add_argument("--timeout", dest="rollout_timeout", type=float, default=0.0, help="seconds per attempt")
    p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--train", action="store_true", help="mark the rollouts as training rollouts")
    p.add_argument("--id-prefix", default="", help="ids PREFIX-LINE (re-running the same file creates nothing twice)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=enqueue)


def _selector(args: argparse.Namespace) -> dict[str, str]:
    labels = parse_labels(args.label)
    if getattr(args, "run", None):
        labels[LABEL_RUN] = args.run
    return labels


async def list_rollouts(client: LedgerClient, args: argparse.Namespace) -> int:
    if args.page_size <= 0:
        raise CliError("--page-size must be positive", USAGE)
    states = [render.ROLLOUT_STATES[s] for s in args.state]
    labels = _selector(args)
    rollouts: list[rollout_pb2.Rollout] = []
    token = args.page_token
    while True:
        page = await client.list_rollouts_page(states, labels, args.page_size, token)
        rollouts.extend(page.rollouts)
        token = page.next_page_token
        if not token or not args.all:
            break
    if args.json:
        print(render.dumps({"rollouts": [render.as_dict(r) for r in rollouts], "next_page_token": token}))
        return 0
    rows = [
        (
            r.rollout_id,
            render.rollout_state(r.status.state),
            r.metadata.labels.get(LABEL_RUN, "-"),
            r.metadata.labels.get(LABEL_STEP, "-"),
            render.when(r.status.create_time),
            render.single_line(r.status.error_message, 60) or "-",
        )
        for r in rollouts
    ]
    print(render.table(("ROLLOUT", "STATE", "RUN", "STEP", "CREATED", "ERROR"), rows))
    if token:
        print(f"more: --page-token {token}", file=sys.stderr)
    return 0


async def show_rollout(client: LedgerClient, args: argparse.Namespace) -> int:
    rollout = await client.get_rollout(args.rollout_id)
    events = await client.list_events(args.rollout_id, attempt_id=args.attempt) if rollout.status.attempt_id else []
    if args.json:
        print(render.dumps({"rollout": render.as_dict(rollout), "events": [render.as_dict(e) for e in events]}))
    else:
        print(render.conversation(rollout, events, tokens=args.tokens))
    return 0


async def watch(client: LedgerClient, args: argparse.Namespace) -> int:
    labels = _selector(args)
    after = args.after
    if after is None:  # from now: the end of the log, found in one scan that matches nothing
        page = await client.list_terminal(0, {"agl.cli/none": uuid.uuid4().hex}, page_size=1)
        after = page.next_cursor
    if not args.json:
        print(f"watching terminal rollouts after cursor {after} (Ctrl-C stops)", file=sys.stderr, flush=True)
    seen = 0
    async for entry in client.watch_terminal(after, labels, include_events=True):
        rollout = entry.rollout
        reward = render.reward_of(entry.events)
        if args.json:
            item = {"cursor": entry.cursor, "rollout": render.as_dict(rollout), "reward": reward}
            print(json.dumps(item, ensure_ascii=False), flush=True)
        else:
            duration = render.seconds_between(rollout.status.start_time, rollout.status.end_time)
            error = rollout.status.error_message
            print(
                f"{entry.cursor:>8}  {rollout.rollout_id}  {render.rollout_state(rollout.status.state)}"
                f"  reward {'-' if reward is None else render.number(reward)}"
                f"  {'-' if duration is None else f'{duration:.2f}s'}"
                + (f"  error: {render.single_line(error, 80)}" if error else ""),
                flush=True,
            )
        seen += 1
        if args.limit and seen >= args.limit:
            break
    return 0


def _read_inputs(path: str) -> list[str]:
    text = sys.stdin.read() if path == "-" else _read_file(path)
    inputs: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            json.loads(line)
        except ValueError as exc:
            raise CliError(f"{path}:{number}: not valid JSON ({exc})", USAGE) from None
        inputs.append(line.strip())
    if not inputs:
        raise CliError(f"{path}: no inputs (one JSON value per line)", USAGE)
    return inputs


def _read_file(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}", USAGE) from None


def _config(args: argparse.Namespace) -> rollout_pb2.RolloutConfig:
    config = rollout_pb2.RolloutConfig(timeout_seconds=args.rollout_timeout)
    if args.rollout_timeout < 0:
        raise CliError("--timeout must not be negative", USAGE)
    if args.agent_class:
        config.local.agent_class = args.agent_class
    if args.command:
        config.local.command.extend(shlex.split(args.command))
    for item in args.env_map:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise CliError(f"--env-map {item!r}: expected NAME=PATH, e.g. QUESTION=input.question", USAGE)
        config.local.env_map[name] = path
    if args.k8s_template is not None:
        config.k8s.job_template = _read_file(str(args.k8s_template))
    if not (args.agent_class or args.command or args.k8s_template):
        raise CliError("say what runs each rollout: --agent-class, --command or --k8s-template", USAGE)
    return config


async def enqueue(client: LedgerClient, args: argparse.Namespace) -> int:
    config = _config(args)
    inputs = _read_inputs(args.file)
    labels = parse_labels(args.label)
    specs = [
        rollout_pb2.RolloutSpec(
            rollout_id=f"{args.id_prefix}-{i}" if args.id_prefix else "",
            input_json=text,
            is_train=args.train,
            config=config,
            metadata=rollout_pb2.RolloutMetadata(labels=labels),
        )
        for i, text in enumerate(inputs, 1)
    ]
    rollouts = await client.create_rollouts(specs)
    if args.json:
        print(render.dumps({"rollout_ids": [r.rollout_id for r in rollouts]}))
    else:
        for rollout in rollouts:
            print(rollout.rollout_id)
        print(f"enqueued {len(rollouts)} rollouts", file=sys.stderr)
    return 0
