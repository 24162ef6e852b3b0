"""Settings of `agl`: one frozen object from the global flags, with the services' AGL_* environment defaults."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass

from services import settings as st

DEFAULT_LEDGER = "127.0.0.1:50051"


@dataclass(frozen=True)
class CliConfig:
    ledger: str = DEFAULT_LEDGER
    key: str | None = None  # never printed
    timeout_s: float = 10.0
    json: bool = False


_D = CliConfig()
SETTINGS = st.Settings(
    "agl",
    "Look at and steer an AGL ledger.",
    [
        st.Setting("--ledger", "AGL_LEDGER_ADDR", st.text(nonempty=True), _D.ledger, "ledger gRPC address host:port"),
        st.Setting("--key", "AGL_KEY", st.text(empty_is_none=True), _D.key, "the ledger's bearer key", secret=True),
        st.Setting("--timeout", "AGL_CLI_TIMEOUT", st.seconds(), _D.timeout_s, "seconds one call may take",
                   name="timeout_s"),
    ],
)  # fmt: skip


def add_global_flags(parser: argparse.ArgumentParser) -> None:
    """The global flags, given before the subcommand; `from_args` resolves them with the environment."""
    SETTINGS.add_flags(parser)


def from_args(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> CliConfig:
    """The settings of a parsed command line; a bad flag or variable exits 2 with one line."""
    return CliConfig(**SETTINGS.resolve(args, env), json=getattr(args, "json", False))
