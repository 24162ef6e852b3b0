"""`agl-console` / `python -m services.console`: parse flags, set up logging, serve the app with uvicorn."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

import uvicorn

from .app import create_app
from .config import parse_args


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(argv)
    logging.basicConfig(level=config.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    uvicorn.run(create_app(config), host=config.host, port=config.port, log_level="warning", access_log=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
