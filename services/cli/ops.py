"""`agl models` and `agl proxy pause|resume|drain|state`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from urllib.parse import urlsplit

from services._gen.agl.v1 import model_pb2, proxy_control_pb2
from services.client import LedgerClient

from . import render
from .errors import TIMED_OUT, USAGE, CliError


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="registered model endpoints (list, register, rm)")
    p.add_argument("--model", default="", help="only this model")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=models)
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    r = actions.add_parser("register", help="route a model name to an OpenAI-compatible engine")
    r.add_argument("name", help="the model name the proxies route (the trainer's agl.model_name)")
    r.add_argument("url", help="the engine's base URL, e.g. http://10.0.0.5:8000/v1")
    r.add_argument("--version", type=int, default=0, help="the weights version it serves (the trainer's step)")
    r.add_argument("--json", action="store_true")
    r.set_defaults(handler=models_register)
    r = actions.add_parser("rm", help="remove a model's endpoints (all of them, or the one URL)")
    r.add_argument("name")
    r.add_argument("url", nargs="?", default="", help="only this endpoint")
    r.add_argument("--json", action="store_true")
    r.set_defaults(handler=models_rm)

    proxy = sub.add_parser("proxy", help="pause, resume or drain every proxy replica, or show their state")
    actions = proxy.add_subparsers(dest="action", metavar="ACTION", required=True)
    model = {"default": "", "help": "only the calls routed to this model (a run's model name)"}
    p = actions.add_parser("pause", help="new model calls get 429 with Retry-After")
    p.add_argument("--model", **model)
    p.add_argument("--reason", default="paused with agl")
    p.add_argument("--retry-after", type=int, default=5, help="seconds agents are told to wait")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=proxy_pause)
    p = actions.add_parser("resume", help="accept model calls again")
    p.add_argument("--model", **model)
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=proxy_resume)
    p = actions.add_parser("drain", help="pause, then wait until no replica has a call in flight")
    p.add_argument("--model", **model)
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


def engine_url(url: str) -> str:
    """An http(s) base URL with a host; anything else is a usage error naming it."""
    parsed = urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise CliError(f"{url!r} is not an engine base URL (expected http://HOST:PORT/v1)", USAGE)
    try:
        parsed.port  # noqa: B018 (raises on a port that is not a number)
    except ValueError:
        raise CliError(f"{url!r}: the port is not a number", USAGE) from None
    return url.rstrip("/")


async def models_register(client: LedgerClient, args: argparse.Namespace) -> int:
    if args.version < 0:
        raise CliError("--version must not be negative", USAGE)
    endpoint = model_pb2.ModelEndpoint(model_name=args.name, endpoint=engine_url(args.url), version=args.version)
    stored = await client.register_models([endpoint])
    if args.json:
        print(render.dumps({"endpoints": [render.as_dict(e) for e in stored]}))
    else:
        print(f"registered {args.name} -> {endpoint.endpoint} (version {args.version})")
    return 0


async def models_rm(client: LedgerClient, args: argparse.Namespace) -> int:
    url = engine_url(args.url) if args.url else ""
    deleted = await client.delete_models([model_pb2.ModelEndpointKey(model_name=args.name, endpoint=url)])
    if args.json:
        print(render.dumps({"deleted": deleted}))
    elif deleted:
        print(f"removed {deleted} endpoint(s) of {args.name}")
    if not deleted:
        what = f"{args.name} at {url}" if url else args.name
        raise CliError(f"no endpoint of {what} is registered", USAGE)
    return 0


def drained(control: proxy_control_pb2.ProxyControl, model: str = "") -> bool:
    """Every replica applied the control's generation and has no call in flight (routed to `model`, if named)."""
    return all(
        r.observed_generation >= control.generation and (r.model_in_flight.get(model, 0) if model else r.in_flight) == 0
        for r in control.replicas
    )


def _print_control(control: proxy_control_pb2.ProxyControl, as_json: bool, model: str = "") -> None:
    if as_json:
        paused = any(p.model_name == model for p in control.model_pauses) if model else control.paused
        print(render.dumps({"control": render.as_dict(control), "drained": paused and drained(control, model)}))
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
    for pause in control.model_pauses:
        print(
            f"model {pause.model_name} paused  retry-after {pause.retry_after_seconds}s"
            + (f"  by {pause.owner}" if pause.owner else "")
            + (f"  reason: {pause.reason}" if pause.reason else "")
        )
    if rows:
        print(render.table(("REPLICA", "IN FLIGHT", "APPLIED", "REPORTED"), rows))
    else:
        print("(no live proxy replicas)")


async def proxy_pause(client: LedgerClient, args: argparse.Namespace) -> int:
    if args.retry_after < 0:
        raise CliError("--retry-after must not be negative", USAGE)
    control = await client.set_proxy_pause(True, args.retry_after, args.reason, model_name=args.model)
    _print_control(control, args.json, args.model)
    return 0


async def proxy_resume(client: LedgerClient, args: argparse.Namespace) -> int:
    _print_control(await client.set_proxy_pause(False, model_name=args.model), args.json)
    return 0


async def proxy_state(client: LedgerClient, args: argparse.Namespace) -> int:
    _print_control(await client.get_proxy_control(), args.json)
    return 0


async def proxy_drain(client: LedgerClient, args: argparse.Namespace) -> int:
    if args.wait < 0:
        raise CliError("--wait must not be negative", USAGE)
    control = await client.set_proxy_pause(True, args.retry_after, args.reason, model_name=args.model)
    generation = control.generation

    async def settled() -> proxy_control_pb2.ProxyControl:
        async with contextlib.aclosing(client.watch_proxy_control()) as stream:
            async for current in stream:
                if current.generation >= generation and drained(current, args.model):
                    return current
        raise CliError("the proxy-control stream ended")

    try:
        control = control if drained(control, args.model) else await asyncio.wait_for(settled(), args.wait)
    except asyncio.TimeoutError:
        raise CliError(
            f"proxies paused but not drained after {args.wait:g}s (calls still in flight); they stay paused",
            TIMED_OUT,
        ) from None
    if not args.json:
        print(f"drained: {len(control.replicas)} replicas paused with nothing in flight", file=sys.stderr)
    _print_control(control, args.json, args.model)
    return 0
