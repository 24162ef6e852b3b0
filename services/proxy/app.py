"""The proxy's HTTP transport: a Starlette app assembling the routes (routes/, v1/rest_routes.py) over the
proxy's runtime, and the one place errors become HTTP answers.

An error's status comes from the one table in errors.py; its body's shape from the route that took the request
(routes/error_shapes.py): Anthropic's under the Messages API, OpenAI's elsewhere.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from services import http_serving as serving
from services.printable import printable
from services.proxy.config import ProxyConfig, parse_config
from services.proxy.errors import ProxyError
from services.proxy.routes import admin, agent, ops
from services.proxy.routes.client_limits import limits_for
from services.proxy.routes.error_shapes import error_shape_of
from services.proxy.runtime import ProxyRuntime, runtime_of
from services.proxy.v1.rest_routes import RestFacade

log = logging.getLogger(__name__)


def _shaped(request: Request, err: ProxyError, status: int, headers: dict[str, str] | None = None) -> Response:
    body = error_shape_of(request.scope)(err.body(), status)
    return JSONResponse(body, status_code=status, headers=headers)


async def _proxy_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ProxyError)
    runtime_of(request).metrics.rejected.labels(exc.kind).inc()
    if exc.status >= 500:
        path, message = printable(request.url.path), printable(exc.message)
        log.warning("%s %s -> %d %s", request.method, path, exc.status, message)
    return _shaped(request, exc, exc.status, exc.headers)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = "not_found" if exc.status_code in (404, 405) else "invalid_request"
    return _shaped(request, ProxyError(kind, f"{request.method} {request.url.path}: {exc.detail}"), exc.status_code)


async def _client_left(request: Request, exc: Exception) -> Response:
    """The agent left (or its body deadline passed, answered 408 by the server) before its request was in:
    nobody to answer and no bug, so one line naming the rollout instead of a traceback."""
    params = request.path_params
    rollout_id, attempt_id = params.get("rollout_id"), params.get("attempt_id", "-")
    where = f"rollout {printable(rollout_id)} attempt {printable(attempt_id)}" if rollout_id else "no rollout"
    log.info(
        "%s: %s %s: the agent left before its request arrived (or its body deadline passed)",
        where,
        request.method,
        printable(request.url.path),
    )
    return Response(status_code=400)


async def _internal_error(request: Request, exc: Exception) -> Response:
    # A bug, not the agent's fault: answered in the route's shape, never with a traceback (Starlette re-raises it
    # after this answer, and uvicorn logs it with its traceback).
    err = ProxyError("internal", "The proxy failed to handle this request; see its log.")
    return _shaped(request, err, err.status)


def create_app(config: ProxyConfig) -> Starlette:
    runtime = ProxyRuntime(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await runtime.start()
        try:
            yield
        finally:
            await runtime.stop()

    routes = [
        *agent.routes(),
        *ops.routes(),
        *admin.routes(),
        # Agent Lightning v1.0's store routes (/api/rollouts..., /api/models) over the ledger's gRPC, and its
        # gateway management routes (/proxy/pause, /proxy/resume, /proxy/state) over the coordinator.
        *RestFacade(runtime.client, runtime.auth, runtime.coordinator).routes(),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={
            ProxyError: _proxy_error,
            HTTPException: _http_error,
            ClientDisconnect: _client_left,
            Exception: _internal_error,
        },
    )
    app.state.runtime = runtime
    return app


def app_from_argv() -> Starlette:
    """Factory for uvicorn workers: each worker process rebuilds the config from the same flags and env."""
    config = parse_config()
    serving.configure(limits_for(config))  # the protocol of this worker serves with the same client limits
    return create_app(config)
