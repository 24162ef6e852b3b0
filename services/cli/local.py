"""`agl train`, `agl try`, `agl eval`, `agl export`: commands that start their own services (services/cli/train/)."""

from __future__ import annotations

import argparse

from .train import options


def add_parsers(sub: argparse._SubParsersAction) -> None:
    options.add_train_parser(sub).set_defaults(local_handler=_train)
    options.add_try_parser(sub).set_defaults(local_handler=_try)
    options.add_eval_parser(sub).set_defaults(local_handler=_eval)
    options.add_export_parser(sub).set_defaults(local_handler=_export)


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

    return run_export_command(args.run, args.to, args.dtype, args.merge_adapter)
