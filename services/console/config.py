"""Console settings: one frozen object from flags with AGL_* environment defaults (keys are never logged)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ConsoleConfig:
    host: str = "127.0.0.1"  # localhost unless asked otherwise
    port: int = 8090
    ledger: str = "127.0.0.1:50051"
    key: str | None = None  # the master key: the ledger's bearer key, also accepted at the login page
    console_key: str | None = None  # a read-only key accepted at the login page only
    page_size: int = 100
    log_level: str = "INFO"

    @property
    def login_keys(self) -> tuple[str, ...]:
        return tuple(k for k in (self.key, self.console_key) if k)


def parse_args(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> ConsoleConfig:
    env = os.environ if env is None else env
    d = ConsoleConfig()
    p = argparse.ArgumentParser(prog="agl-console", description="AGL web console (reads the ledger over gRPC).")
    p.add_argument("--host", default=env.get("AGL_CONSOLE_HOST", d.host), help="bind address (default localhost)")
    p.add_argument("--port", type=int, default=int(env.get("AGL_CONSOLE_PORT", d.port)))
    p.add_argument("--ledger", default=env.get("AGL_LEDGER_ADDR", d.ledger), help="ledger gRPC address")
    p.add_argument("--key", default=env.get("AGL_KEY") or None, help="master key (the ledger's key; env AGL_KEY)")
    p.add_argument(
        "--console-key",
        default=env.get("AGL_CONSOLE_KEY") or None,
        help="read-only key accepted at the login page (env AGL_CONSOLE_KEY)",
    )
    p.add_argument("--page-size", type=int, default=int(env.get("AGL_CONSOLE_PAGE_SIZE", d.page_size)))
    p.add_argument("--log-level", default=env.get("AGL_LOG_LEVEL", d.log_level))
    args = p.parse_args(argv)
    if not args.key and not args.console_key:
        p.error("the console shows nothing without a login key: set --key/AGL_KEY or --console-key/AGL_CONSOLE_KEY")
    if not 1 <= args.page_size <= 1000:
        p.error("--page-size must be 1..1000")
    return ConsoleConfig(
        host=args.host,
        port=args.port,
        ledger=args.ledger,
        key=args.key,
        console_key=args.console_key,
        page_size=args.page_size,
        log_level=args.log_level.upper(),
    )
