"""The operations routes: liveness (/healthz), readiness (/readyz), what this replica knows (/status) and its
Prometheus metrics (/metrics). They ask for no key."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute

from services.proxy.engines.routing import RoutingTable
from services.proxy.routes.error_shapes import ShapedRoute, openai_shape
from services.proxy.runtime import runtime_of


async def healthz(request: Request) -> Response:
    """Alive: exactly v1.0's body (clients compare it); what this replica knows is on /status."""
    return JSONResponse({"status": "ok"})


def _held_back(table: RoutingTable) -> dict[str, str]:
    """The endpoints of one model not routed to, and why: below its highest version, or held by the engine's state."""
    newest = max((e.version for e in table.endpoints), default=0)
    held = {e.url: f"registered at version {e.version}, below the model's {newest}" for e in table.stale}
    return {**held, **table.held}


async def replica_status(request: Request) -> Response:
    """This replica's view: its own model's endpoints at the top level (as before several models), every model's
    under `models`."""
    runtime = runtime_of(request)
    routing, coordinator = runtime.routing, runtime.coordinator
    own = routing.table()
    status = {"status": "ok", "replica_id": coordinator.replica_id, "model": runtime.config.model_name}
    status.update(endpoints=[e.url for e in own.endpoints], paused=coordinator.paused)
    status["in_flight"] = coordinator.in_flight
    status["held_back"] = _held_back(own)
    status["models"] = {
        t.model_name: {
            "endpoints": [e.url for e in t.endpoints],
            "held_back": _held_back(t),
            "paused": coordinator.paused_for(t.model_name),
            "in_flight": coordinator.model_in_flight.get(t.model_name, 0),
        }
        for t in routing.tables
    }
    return JSONResponse(status)


async def readyz(request: Request) -> Response:
    """200 while the ledger answers the proxy's key and the model registry has been seen, else 503 with why."""
    runtime = runtime_of(request)
    status = runtime.readiness.describe()
    status["endpoints"] = runtime.routing.count()[0]
    return JSONResponse(status, status_code=200 if runtime.readiness.ready else 503)


async def metrics(request: Request) -> Response:
    runtime = runtime_of(request)
    runtime.metrics.set_counts(runtime.upstream.pool.opened, runtime.gateway.append_requests)
    return Response(generate_latest(runtime.metrics.registry), media_type=CONTENT_TYPE_LATEST)


def routes() -> list[BaseRoute]:
    return [
        ShapedRoute("/healthz", healthz, methods=["GET"], error_shape=openai_shape),
        ShapedRoute("/status", replica_status, methods=["GET"], error_shape=openai_shape),
        ShapedRoute("/readyz", readyz, methods=["GET"], error_shape=openai_shape),
        ShapedRoute("/metrics", metrics, methods=["GET"], error_shape=openai_shape),
    ]
