"""The operator's routes: pause, resume, drain and read the pause state of every replica (through the ledger,
fleet/coordination.py). Master key only; errors OpenAI-shaped like the proxy's own. A body naming a `model` pauses,
resumes or drains only the calls routed to that model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute

from services import http_serving as serving
from services.proxy.auth import presented_key
from services.proxy.call.rewrite import parse_body
from services.proxy.errors import ProxyError
from services.proxy.routes.error_shapes import ShapedRoute, openai_shape
from services.proxy.routes.request_body import read_body
from services.proxy.runtime import runtime_of

_MAX_BODY = 64 * 1024
# The longest Retry-After a pause may tell agents (a day); the ledger keeps it as a 32-bit number.
_MAX_RETRY_AFTER_S = 86_400
_MAX_LEASE_S = 86_400
_MAX_OWNER = 200


@dataclass(frozen=True)
class PauseTerms:
    """What a pause (or the pause a drain starts with) tells agents and the ledger."""

    retry_after_s: int
    reason: str
    owner: str  # who holds the pause ("" for nobody in particular); the ledger checks it goes with a lease
    lease_s: float  # 0: held until resumed
    model: str = ""  # only the calls routed to this model ("": every call)


async def _admin_body(request: Request) -> dict[str, Any]:
    """The body of an admin call, the caller checked to hold the master key; {} for an empty body."""
    runtime_of(request).auth.require_master(presented_key(request.headers))
    serving.trust_connection(request.scope)
    raw = await read_body(request, _MAX_BODY)
    return parse_body(raw) if raw.strip() else {}


def _number(body: dict[str, Any], name: str, default: int, most: int) -> float:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= most:
        raise ProxyError("invalid_request", f"`{name}` must be a number between 0 and {most}.")
    return value


def _model(body: dict[str, Any]) -> str:
    model = body.get("model", "")
    if not isinstance(model, str) or len(model) > _MAX_OWNER:
        raise ProxyError("invalid_request", f"`model` must be a string of at most {_MAX_OWNER} characters.")
    return model


def pause_terms(body: dict[str, Any]) -> PauseTerms:
    """The terms of a pause from an admin body, each field checked (400 `invalid_request` naming it)."""
    retry_after = int(_number(body, "retry_after_seconds", 5, _MAX_RETRY_AFTER_S))
    owner = body.get("owner", "")
    if not isinstance(owner, str) or len(owner) > _MAX_OWNER:
        raise ProxyError("invalid_request", f"`owner` must be a string of at most {_MAX_OWNER} characters.")
    lease = float(_number(body, "lease_seconds", 0, _MAX_LEASE_S))
    return PauseTerms(retry_after, str(body.get("reason", "")), owner, lease, _model(body))


async def pause(request: Request) -> Response:
    terms = pause_terms(await _admin_body(request))
    coordinator = runtime_of(request).coordinator
    return JSONResponse(
        await coordinator.pause(terms.retry_after_s, terms.reason, terms.owner, terms.lease_s, terms.model)
    )


async def resume(request: Request) -> Response:
    model = _model(await _admin_body(request))
    return JSONResponse(await runtime_of(request).coordinator.resume(model))


async def state(request: Request) -> Response:
    await _admin_body(request)
    return JSONResponse(await runtime_of(request).coordinator.state())


async def drain(request: Request) -> Response:
    body = await _admin_body(request)
    timeout = body.get("timeout_seconds", 60)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout < 0:
        raise ProxyError("invalid_request", "`timeout_seconds` must be a non-negative number.")
    terms = pause_terms(body)
    coordinator = runtime_of(request).coordinator
    result = await coordinator.drain(
        float(timeout), terms.retry_after_s, terms.reason, terms.owner, terms.lease_s, terms.model
    )
    return JSONResponse(result)


def routes() -> list[BaseRoute]:
    return [
        ShapedRoute("/admin/pause", pause, methods=["POST"], error_shape=openai_shape),
        ShapedRoute("/admin/resume", resume, methods=["POST"], error_shape=openai_shape),
        ShapedRoute("/admin/state", state, methods=["GET"], error_shape=openai_shape),
        ShapedRoute("/admin/drain", drain, methods=["POST"], error_shape=openai_shape),
    ]
