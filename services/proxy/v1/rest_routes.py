"""Agent Lightning v1.0's REST routes, served by the proxy over the ledger's gRPC (a thin facade, no state).

v1.0 served its store and its model proxy from one gateway process on one port, so its scripts and trainers use a
single base URL for both; the proxy is AGL's HTTP face and already holds a master-key ledger client, so it serves
these routes beside the model routes and a v1.0 script only needs the proxy's URL. Every route needs the master
key (`Authorization: Bearer` or `x-api-key`). Paths, bodies and status codes are v1.0's: 201 on create (also for
ids that exist: create is idempotent), 204 on delete (also for ids that do not exist), 404 for an unknown rollout,
409 for an illegal transition, 422 for a body v1.0 would refuse, errors as {"detail": ...} in v1.0's words where
v1.0 had them. A ledger error maps through the proxy's one table (errors.LEDGER_ERROR_KINDS, as on the agents'
routes: 409 for ABORTED, 503 when the ledger cannot be reached), only a request it finds invalid being 422 here.
v1.0's gateway management (/proxy/pause, /proxy/resume, /proxy/state) is here too, over the
coordinator (v1/pause_routes.py). v1.0's one attempt "0" lists, as v1.0 had it, everything posted to the rollout's
current attempt and what was posted before any claim (filed under no attempt, shown as "0").
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from services import http_serving
from services._gen.agl.v1 import event_pb2, model_pb2, rollout_pb2
from services.client import LedgerClient, LedgerError, NotFound
from services.proxy.auth import Authorizer, presented_key
from services.proxy.call.rewrite import loads_lenient
from services.proxy.errors import ProxyError, v1_status
from services.proxy.events.checks import writable
from services.proxy.fleet.coordination import Coordinator
from services.proxy.v1.pause_routes import GatewayControl
from services.proxy.v1.rest_shapes import (
    DEFAULT_ATTEMPT_ID,
    STATES,
    ShapeError,
    event_json,
    model_endpoint,
    model_json,
    rollout_json,
    rollout_spec,
    status_patch,
    terminal_item,
    transition_refusal,
)

log = logging.getLogger(__name__)

ALL_ATTEMPTS = "*"

_MAX_BODY = 64 * 1024 * 1024
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_MAX_PAGE = 1000


def _json(content: Any, status_code: int = 200, headers: dict[str, str] | None = None) -> Response:
    """JSON by orjson: a value stored with NaN or Infinity (an agent's event data) comes back as null, not a 500;
    one orjson cannot write (nested too deeply, a lone surrogate) comes back cut where it cannot (`writable`)."""
    try:
        text = orjson.dumps(content)
    except orjson.JSONEncodeError:
        text = orjson.dumps(writable(content))
    return Response(text, status_code=status_code, headers=headers, media_type="application/json")


class RestError(Exception):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


def _int_param(request: Request, name: str, default: int) -> int:
    """An integer query parameter, within what the ledger's 64-bit fields hold (422 otherwise)."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise RestError(422, f"Query parameter `{name}` must be an integer, not {raw[:100]!r}.") from None
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise RestError(422, f"Query parameter `{name}` must be between {_INT64_MIN} and {_INT64_MAX}.")
    return value


async def _json_body(request: Request) -> Any:
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > _MAX_BODY:
            raise RestError(413, f"The body is larger than the limit of {_MAX_BODY} bytes.")
        chunks.append(chunk)
    raw = b"".join(chunks)
    try:
        return loads_lenient(raw)
    except ValueError as err:
        raise RestError(422, f"The body is not valid JSON: {err}") from None


def _list_body(body: Any) -> list[Any]:
    if not isinstance(body, list):
        raise RestError(422, "The body must be a JSON list.")
    return body


class RestFacade:
    """The routes, bound to the proxy's ledger client and key."""

    def __init__(self, client: LedgerClient, auth: Authorizer, coordinator: Coordinator) -> None:
        self.client = client
        self.auth = auth
        self.gateway = GatewayControl(coordinator)

    def routes(self) -> list[Route]:
        wrap = self._wrap
        return [
            Route("/api/rollouts", wrap(self.create_rollouts), methods=["POST"]),
            Route("/api/rollouts", wrap(self.list_rollouts), methods=["GET"]),
            Route("/api/rollouts/terminal", wrap(self.list_terminal), methods=["GET"]),
            Route("/api/rollouts/{rollout_id}", wrap(self.get_rollout), methods=["GET"]),
            Route("/api/rollouts/{rollout_id}", wrap(self.patch_rollout), methods=["PATCH"]),
            Route("/api/rollouts/{rollout_id}", wrap(self.delete_rollout), methods=["DELETE"]),
            Route("/api/rollouts/{rollout_id}/events", wrap(self.list_events), methods=["GET"]),
            Route("/api/models", wrap(self.register_models), methods=["POST"]),
            Route("/api/models", wrap(self.delete_models), methods=["DELETE"]),
            Route("/proxy/pause", wrap(self.pause), methods=["POST"]),
            Route("/proxy/resume", wrap(self.resume), methods=["POST"]),
            Route("/proxy/state", wrap(self.state), methods=["GET"]),
        ]

    def _wrap(self, handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        async def route(request: Request) -> Response:
            try:
                if not self.auth.is_master(presented_key(request.headers)):
                    raise RestError(401, "Invalid or missing API key")
                http_serving.trust_connection(request.scope)
                return await handler(request)
            except RestError as err:
                return _json({"detail": err.detail}, status_code=err.status)
            except ProxyError as err:  # the coordinator's: the ledger away or refusing the proxy's key
                return _json({"detail": err.message}, status_code=err.status, headers=err.headers)
            except ShapeError as err:
                return _json({"detail": str(err)}, status_code=422)
            except UnicodeEncodeError as err:  # a string of the body with a lone surrogate (JSON's \udc80)
                detail = f"A string in the request holds a lone surrogate, which is not text: {err.reason}."
                return _json({"detail": detail}, status_code=422)
            except LedgerError as err:
                rollout_id = request.path_params.get("rollout_id")
                if isinstance(err, NotFound) and rollout_id is not None:
                    return _json({"detail": f"Rollout not found: {rollout_id}"}, status_code=404)  # v1.0's words
                status = v1_status(err)
                if status is None:
                    log.error("%s %s: ledger answered %s: %s", request.method, request.url.path, err.code_name,
                              err.details())  # fmt: skip
                    status = 500
                return _json({"detail": err.message}, status_code=status)

        return route

    # -- rollouts ----------------------------------------------------------------------------------------------

    async def create_rollouts(self, request: Request) -> Response:
        specs = [rollout_spec(item, k) for k, item in enumerate(_list_body(await _json_body(request)))]
        created = await self.client.create_rollouts(specs) if specs else []
        return _json([rollout_json(rollout) for rollout in created], status_code=201)

    async def list_rollouts(self, request: Request) -> Response:
        names = request.query_params.getlist("state_in")
        if not names:
            raise RestError(422, f"Query parameter `state_in` is required (one or more of {', '.join(STATES)}).")
        unknown = [name for name in names if name not in STATES]
        if unknown:
            raise RestError(422, f"Unknown state(s) {', '.join(unknown)}: use {', '.join(STATES)}.")
        limit = max(0, _int_param(request, "limit", 500))
        states = [STATES[name] for name in names]
        rollouts = await self.client.list_rollouts(states, page_size=min(max(limit, 1), _MAX_PAGE))
        return _json([rollout_json(rollout) for rollout in rollouts[:limit]])

    async def list_terminal(self, request: Request) -> Response:
        after = max(0, _int_param(request, "after", 0))
        limit = min(max(1, _int_param(request, "limit", 1000)), _MAX_PAGE)
        page = await self.client.list_terminal(after_cursor=after, page_size=limit)
        # The ledger's cursors are positions in the completion log, as v1.0's `after` is: v1.0's `limit` counts
        # positions, a deleted rollout's included (it gives no item), so the page stops at after + limit.
        last = after + limit
        items = [terminal_item(entry.rollout) for entry in page.entries if entry.cursor <= last]
        next_after = max(min(page.next_cursor, last), after)
        # v1.0's total counts the log's positions, deleted rollouts' too: the ledger's end position.
        end, full = max(page.next_cursor, after), len(page.entries) >= limit
        while full:
            more = await self.client.list_terminal(after_cursor=end, page_size=_MAX_PAGE)
            end, full = max(more.next_cursor, end), len(more.entries) >= _MAX_PAGE
        return _json({"items": items, "next_after": next_after, "total_terminal": end})

    async def get_rollout(self, request: Request) -> Response:
        rollout_id = request.path_params["rollout_id"]
        rollout = await self.client.get_rollout(rollout_id)
        # v1.0: the attempts that have events, in the order of their first event; events filed under no attempt
        # (v1.0's "0" before any claim) are v1.0's attempt "0".
        attempts: list[str] = []
        for event in await self.client.list_events(rollout_id, attempt_id=ALL_ATTEMPTS):
            attempt = event.attempt_id or DEFAULT_ATTEMPT_ID
            if attempt not in attempts:
                attempts.append(attempt)
        return _json({"rollout": rollout_json(rollout), "attempts": attempts})

    async def patch_rollout(self, request: Request) -> Response:
        rollout_id = request.path_params["rollout_id"]
        patch = status_patch(await _json_body(request))
        current = await self.client.get_rollout(rollout_id)
        if not patch:
            return _json(rollout_json(current))
        state = STATES[patch["state"]] if "state" in patch else current.status.state
        refused = transition_refusal(rollout_id, current.status.state, state)
        if refused:
            raise RestError(409, refused)
        attempt_id = patch.get("last_attempt_id", "")
        if state == rollout_pb2.ROLLOUT_STATE_RUNNING and not attempt_id and not current.status.attempt_id:
            attempt_id = DEFAULT_ATTEMPT_ID  # v1.0 runs every rollout as attempt "0"
        updated = await self.client.update_status(
            rollout_id,
            state,
            error_message=patch.get("error_message", ""),
            attempt_id=attempt_id,
            launcher_ref=patch.get("k8s_job_name", ""),
        )
        return _json(rollout_json(updated))

    async def delete_rollout(self, request: Request) -> Response:
        await self.client.delete_rollouts([request.path_params["rollout_id"]])
        return Response(status_code=204)

    # -- events ------------------------------------------------------------------------------------------------

    async def list_events(self, request: Request) -> Response:
        rollout_id = request.path_params["rollout_id"]
        triplet = request.query_params.get("format") == "triplet"  # anything else lists in full, as in v1.0
        view = event_pb2.EVENT_VIEW_TRIPLET if triplet else event_pb2.EVENT_VIEW_FULL
        # v1.0 lists the rollout's current attempt, whose events in v1.0 include those posted before the claim:
        # here the current (or, between attempts, the latest) attempt's events and those filed under none.
        status = (await self.client.get_rollout(rollout_id)).status
        current = status.attempt_id or (status.attempts[-1].attempt_id if status.attempts else "")
        events = await self.client.list_events(
            rollout_id, attempt_id=ALL_ATTEMPTS, event_type=request.query_params.get("event_type", ""), view=view
        )
        return _json([event_json(event, triplet) for event in events if event.attempt_id in ("", current)])

    # -- models ------------------------------------------------------------------------------------------------

    async def register_models(self, request: Request) -> Response:
        endpoints = [model_endpoint(item, k) for k, item in enumerate(_list_body(await _json_body(request)))]
        registered = await self.client.register_models(endpoints) if endpoints else []
        return _json([model_json(endpoint) for endpoint in registered], status_code=201)

    async def delete_models(self, request: Request) -> Response:
        names = {endpoint.model_name for endpoint in await self.client.list_models()}
        if names:
            await self.client.delete_models([model_pb2.ModelEndpointKey(model_name=name) for name in sorted(names)])
        return _json({"status": "ok"})

    # -- the gateway's management (v1.0's trainer pauses and drains around every update in async mode) ------------

    async def pause(self, request: Request) -> Response:
        body = await _json_body(request)
        return _json(await self.gateway.pause(body))

    async def resume(self, request: Request) -> Response:
        return _json(await self.gateway.resume())

    async def state(self, request: Request) -> Response:
        return _json(await self.gateway.state())
