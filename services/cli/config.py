"""Settings of `agl`: one frozen object from the global flags, with the services' AGL_* environment defaults."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_LEDGER = "127.0.0.1:50051"


@dataclass(frozen=True)
class CliConfig:
    ledger: str = DEFAULT_LEDGER
    key: str | None = None  # never printed
    timeout_s: float = 10.0
    json: bool = False


def add_global_flags(parser: argparse.ArgumentParser, env: Mapping[str, str] | None = None) -> None:
    env = os.environ if env is None else env
    parser.add_argument(
        "--ledger",
        default=env.get("AGL_LEDGER_ADDR", DEFAULT_LEDGER),
        help="ledger gRPC address host:port (env AGL_LEDGER_ADDR)",
    )
    parser.add_argument("--key", default=env.get("AGL_KEY") or None, help="the ledger's bearer key (env AGL_KEY)")
    parser.add_argument(
        "--timeout",
        type=float,
        default=float(env.get("AGL_CLI_TIMEOUT", "10")),
        help="seconds one call may take (env AGL_CLI_TIMEOUT)",
    )


def from_args(args: argparse.Namespace) -> CliConfig:
    return CliConfig(ledger=args.ledger, key=args.key, timeout_s=args.timeout, json=getattr(args, "json", False))
