"""`agl-ledger` / `python -m services.ledger`: parse flags, set up logging, run the server."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence

from . import logs
from .config import parse_args
from .server import serve


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(argv)
    logs.configure(config.log_level, config.log_format)
    return asyncio.run(serve(config))


if __name__ == "__main__":
    sys.exit(main())
