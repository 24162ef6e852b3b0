"""agl-proxy: python -m services.proxy --port 8080 --ledger HOST:PORT --model-name NAME [--key K] ..."""

from __future__ import annotations

import asyncio
import logging
import sys

import uvicorn

from services import http_serving as serving
from services.proxy.app import create_app
from services.proxy.config import parse_config
from services.proxy.fleet.readiness import key_refused_at_start
from services.proxy.routes.client_limits import limits_for


def main() -> None:
    config = parse_config()
    logging.basicConfig(level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    refused = asyncio.run(key_refused_at_start(config.ledger, config.key))
    if refused:  # like the controller: a key the ledger refuses is fixed by the operator, not by retrying
        logging.getLogger("services.proxy").error("%s; exiting", refused)
        sys.exit(2)
    limits = limits_for(config)
    serving.configure(limits)
    options = {
        "host": config.host,
        "port": config.port,
        "log_level": config.log_level.lower(),
        "access_log": False,
        # Nothing reads the client address (no access log), so X-Forwarded-* need not be parsed on every request.
        "proxy_headers": False,
        "timeout_keep_alive": limits.keep_alive_s,
        "backlog": 4096,
        # One send per answer instead of two, header and body deadlines, a connection cap (see serving.py).
        "http": serving.GuardedHttpToolsProtocol,
    }
    if config.workers > 1:
        uvicorn.run("services.proxy.app:app_from_argv", factory=True, workers=config.workers, **options)
    else:
        uvicorn.run(create_app(config), **options)


if __name__ == "__main__":
    main()
