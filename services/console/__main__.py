"""`agl-console` / `python -m services.console`: parse flags, set up logging, serve the app with uvicorn."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Sequence
from types import FrameType

import uvicorn
from starlette.applications import Starlette

from services import http_serving

from .app import create_app
from .config import ConsoleConfig, parse_args


class _Server(uvicorn.Server):
    """uvicorn's server, which on SIGTERM/SIGINT also ends the open event streams (they never end by themselves,
    and uvicorn waits for open responses before it shuts down)."""

    app: Starlette | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        if self.app is not None:
            with contextlib.suppress(RuntimeError):  # no running loop yet
                asyncio.get_running_loop().call_soon_threadsafe(self.app.state.mirror.end_streams)


def client_limits(config: ConsoleConfig) -> http_serving.ClientLimits:
    """The proxy's guard against silent and slow clients, with the console's own limits and names."""
    return http_serving.ClientLimits(
        max_connections=http_serving.connection_budget(config.max_connections, upstream=False),
        header_timeout_s=config.header_timeout_s,
        body_timeout_s=config.body_timeout_s,
        keep_alive_s=5.0,
        server="console",
        header_variable="AGL_CONSOLE_HEADER_TIMEOUT",
        body_variable="AGL_CONSOLE_BODY_TIMEOUT",
        cap_variable="AGL_CONSOLE_MAX_CONNECTIONS",
    )


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(argv)
    logging.basicConfig(level=config.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    app = create_app(config)
    limits = client_limits(config)
    http_serving.configure(limits)
    options = {
        "log_level": "warning",
        "access_log": False,
        "timeout_graceful_shutdown": 5,
        "timeout_keep_alive": limits.keep_alive_s,
        # A request head and body must arrive in time, and a connection cap (see services/http_serving).
        "http": http_serving.GuardedHttpToolsProtocol,
    }
    server = _Server(uvicorn.Config(app, host=config.host, port=config.port, **options))
    server.app = app
    server.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
