"""agl-standin-engine: python -m services.standin --host 127.0.0.1 --port P --model NAME [--delay-ms N]."""

from __future__ import annotations

import logging

import uvicorn

from .app import create_app
from .config import parse_config


def main() -> None:
    config = parse_config()
    logging.basicConfig(level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    uvicorn.run(
        create_app(config),
        host=config.host,
        port=config.port,
        log_level=config.log_level,
        access_log=False,
        timeout_keep_alive=60,
    )


if __name__ == "__main__":
    main()
