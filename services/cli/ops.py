"""`agl models` and `agl proxy pause|resume|drain|state`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys

from services._gen.agl.v1 import proxy_control_pb2
from services.client import LedgerClient

from . import render
from .errors import TIMED_OUT, USAGE, CliError


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="registered model endpoints and their weight versions")
    p.add_argument("--model", default="", help="only this model")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=models)

    proxy = sub.add_parser("proxy", help="pause, resume or drain every proxy replica, or show their state")
    actions = proxy.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = actions.add_parser("pause", help="new model calls get 429 with Retry-After")
    p.add_argument("--reason", default="paused with agl")
    p.add_argument("--retry-after", type=int, default=5, help="seconds agents are told to wait")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=proxy_pause)
    p = actions.add_parser("resume", help="accept model calls again")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=proxy_resume)
    p = actions.add_parser("drain", help="pause, then wait until no replica has a call in flight")
    p.add_argument("--reason", default="drained with agl")
    p.add_argument("--retry-after", type=int, default=5)
    p.add_argument("--wait", type=float, default=60.0, help="seconds to wait for the drain (exit 5 after)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=proxy_drain)
    p = actions.add_parser("state", help="pause state and live replicas")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=proxy_state)


async def models(client: LedgerClient, args: argparse.Namespace) -> int:
    endpoints = await client.list_models(args.model)
    if args.json:
        print(render.dumps({"endpoints": [render.as_dict(e) for e in endpoints]}))
        return 0
    rows = [(e.model_name, e.endpoint, str(e.version), render.when(e.update_time)) for e in endpoints]
    print(render.table(("MODEL", "ENDPOINT", "VERSION", "UPDATED"), rows))
    return 0


def drained(control: proxy_control_pb2.ProxyControl) -> bool:
    return all(r.observed_generation >= control.generation and r.in_flight == 0 for r in control.replicas)


def _print_control(control: proxy_control_pb2.ProxyControl, as_json: bool) -> None:
    if as_json:
        print(render.dumps({"control": render.as_dict(control), "drained": control.paused and drained(control)}))
        return
    state = "paused" if control.paused else "serving"
    print(
        f"proxies {state}  generation {control.generation}  since {render.when(control.update_time)}"
        + (f"  reason: {control.reason}" if control.paused and control.reason else "")
        + (f"  retry-after {control.retry_after_seconds}s" if control.paused else "")
    )
    rows = [
        (
            r.replica_id,
            str(r.in_flight),
            "yes" if r.observed_generation >= control.generation else f"no (at {r.observed_generation})",
            render.when(r.report_time),
        )
        for r in control.replicas
    ]
    if rows:
        print(render.table(("REPLICA", "IN FLIGHT", "APPLIED", "REPORTED"), rows))
    else:
        print("(no live proxy replicas)")


async def proxy_pause(client: LedgerClient, args: argparse.Namespace) -> int:
    if args.retry_after < 0:
        raise CliError("--retry-after must not be negative", USAGE)
    _print_control(await client.set_proxy_pause(True, args.retry_after, args.reason), args.json)
    return 0


async def proxy_resume(client: LedgerClient, args: argparse.Namespace) -> int:
    _print_control(await client.set_proxy_pause(False), args.json)
    return 0


async def proxy_state(client: LedgerClient, args: argparse.Namespace) -> int:
    _print_control(await client.get_proxy_control(), args.json)
    return 0


async def proxy_drain(client: LedgerClient, args: argparse.Namespace) -> int:
    if args.wait < 0:
        raise CliError("--wait must not be negative", USAGE)
    control = await client.set_proxy_pause(True, args.retry_after, args.reason)
    generation = control.generation

    async def settled() -> proxy_control_pb2.ProxyControl:
        async with contextlib.aclosing(client.watch_proxy_control()) as stream:
            async for current in stream:
                if current.generation >= generation and drained(current):
                    return current
        raise CliError("the proxy-control stream ended")

    try:
        control = control if drained(control) else await asyncio.wait_for(settled(), args.wait)
    except asyncio.TimeoutError:
        raise CliError(
            f"proxies paused but not drained after {args.wait:g}s (calls still in flight); they stay paused",
            TIMED_OUT,
        ) from None
    if not args.json:
        print(f"drained: {len(control.replicas)} replicas paused with nothing in flight", file=sys.stderr)
    _print_control(control, args.json)
    return 0
