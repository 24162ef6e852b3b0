"""The `agl` argument parser and the dispatch: one handler per subcommand, ledger errors as one-line messages."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from services.client import LedgerClient, LedgerError, RetryPolicy

from . import errors, local, ops, rollouts, runs, stored
from .config import add_global_flags, from_args


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agl",
        description="Look at and steer an AGL ledger: rollouts, runs, models and the proxies.",
        epilog="exit codes: 0 ok, 1 failure, 2 bad usage or unknown id, 3 ledger unreachable, 4 key refused, "
        "5 timed out",
    )
    add_global_flags(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    rollouts.add_parsers(sub)
    runs.add_parsers(sub)
    ops.add_parsers(sub)
    local.add_parsers(sub)
    return parser


async def run(args: argparse.Namespace) -> int:
    config = from_args(args)
    # Few quick retries: a person at a shell wants to hear that the ledger is down, not wait for it.
    retry = RetryPolicy(attempts=2, initial_backoff_s=0.1, max_backoff_s=0.2)
    client = LedgerClient(config.ledger, config.key, retry=retry, call_timeout_s=config.timeout_s)
    try:
        return await args.handler(client, args)
    except LedgerError as err:
        # The services of agl train and make demo stop with them: their runs are read from the run folder.
        hint = "; a finished agl train or make demo run: --from its folder" if "from_dir" in args else ""
        raise errors.from_rpc(err, config.ledger, hint) from None
    finally:
        await client.close()


def from_stored(args: argparse.Namespace) -> int:
    """The command against a finished run's ledger, served from its folder for the command's length."""
    if args.ledger is not None or args.key is not None:
        raise errors.CliError(
            "--from serves the run's own stored ledger with its key: leave out --ledger and --key", errors.USAGE
        )
    with stored.serving(args.from_dir, console=False) as served:
        args.ledger, args.key = served.ledger, served.key
        return asyncio.run(run(args))


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if getattr(args, "local_handler", None) is not None:  # starts its own services: no --ledger client
            return args.local_handler(args)
        if getattr(args, "local", False):  # agl runs --local: the run folders, no ledger
            return local.local_runs(args)
        if getattr(args, "from_dir", None):
            return from_stored(args)
        return asyncio.run(run(args))
    except errors.CliError as exc:
        print(f"agl: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `agl rollouts | head`
        return 0
