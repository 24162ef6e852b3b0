"""`agl train`, `agl try`, `agl eval`, `agl export`: commands that start their own services (services/cli/train/)."""

from __future__ import annotations

import argparse
import signal

from .train import options


def add_parsers(sub: argparse._SubParsersAction) -> None:
    options.add_train_parser(sub).set_defaults(local_handler=_train)
    options.add_try_parser(sub).set_defaults(local_handler=_try)
    options.add_eval_parser(sub).set_defaults(local_handler=_eval)
    options.add_export_parser(sub).set_defaults(local_handler=_export)
    p = sub.add_parser(
        "open",
        help="serve a finished run's stored ledger and console again, until Ctrl-C",
        description="agl train and make demo stop their services when they end; the run's ledger (SQLite) and key "
        "stay in its folder. This starts the ledger and the console on them, on free loopback ports.",
    )
    p.add_argument("run", help="the run's folder (agl-runs/RUN, demo-output) or its run id")
    p.set_defaults(local_handler=_open)
    p = sub.add_parser("logs", help="the output of a run started with agl train --detach (-f: follow it)")
    p.add_argument("run", help="the run's id (under agl-runs/) or its folder")
    p.add_argument("-f", "--follow", action="store_true", help="go on printing until the run ends (Ctrl-C stops)")
    p.set_defaults(local_handler=_logs)
    p = sub.add_parser("stop", help="stop a running agl train as Ctrl-C would (it can be resumed)")
    p.add_argument("run", help="the run's id (under agl-runs/) or its folder")
    p.set_defaults(local_handler=_stop)


# The heavy modules (torch, the deploy stack) load only when a command runs: `agl rollouts` stays fast.
def _train(args: argparse.Namespace) -> int:
    from .train.session import run_train_command

    return run_train_command(args)


def _try(args: argparse.Namespace) -> int:
    from .train.trial import run_try_command

    return run_try_command(args)


def _eval(args: argparse.Namespace) -> int:
    from .train.evaluate import run_eval_command

    return run_eval_command(args)


def _export(args: argparse.Namespace) -> int:
    from .train.export import run_export_command

    return run_export_command(args.run, args.to, args.dtype, args.merge_adapter, args.weights)


def _open(args: argparse.Namespace) -> int:
    from .stored import serving
    from .train.signals import Interrupted, raise_on_signals

    previous = raise_on_signals()
    try:
        with serving(args.run, console=True) as served:
            key_file = served.folder / "key"
            print(f"run folder {served.folder}")
            print(f"console: {served.console_url} (sign in with the key in {key_file})")
            print(f'ledger: {served.ledger}, e.g. agl --ledger {served.ledger} --key "$(cat {key_file})" runs')
            print("Ctrl-C stops them", flush=True)
            try:
                while True:
                    signal.pause()
            except Interrupted:
                # The stop on the way out is bounded: a second signal (a shell's, or `timeout`'s) must not cut it
                # short and leave the ledger running.
                for sig in previous:
                    signal.signal(sig, signal.SIG_IGN)
        return 0
    except Interrupted:  # during the start: what had started is stopped by serving's own exit
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _logs(args: argparse.Namespace) -> int:
    from .train.background import logs_command

    return logs_command(args.run, args.follow)


def _stop(args: argparse.Namespace) -> int:
    from .train.background import stop_command

    return stop_command(args.run)


def local_runs(args: argparse.Namespace) -> int:
    """`agl runs --local`: the runs under agl-runs/, from their folders (no ledger)."""
    from .errors import USAGE, CliError
    from .train.background import runs_command

    if args.from_dir or args.state or args.label or args.json:
        raise CliError(
            "--local lists the run folders under agl-runs/: it takes none of --from, --state, --label, --json", USAGE
        )
    return runs_command()
