"""The agent's routes: the model-call APIs under a rollout's prefix (OpenAI chat and completions, the model list,
Anthropic Messages and its count_tokens, OpenAI Responses) and the agent's own events.

Each API's routes carry its error shape (routes/error_shapes.py): an error on an Anthropic route is answered in
Anthropic's shape, on the others in OpenAI's (which the Responses API shares).
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute
from starlette.types import Receive, Scope, Send

from services import http_serving as serving
from services.printable import printable
from services.proxy.auth import presented_key
from services.proxy.call.pipeline import Reply
from services.proxy.call.rewrite import CHAT, COMPLETIONS, MODES, parse_body
from services.proxy.dialects import anthropic_messages, openai_responses
from services.proxy.dialects.responses_chain import find, stored_body
from services.proxy.dialects.translation import Dialect
from services.proxy.errors import ProxyError
from services.proxy.events.agent_events import agent_event, refused_event
from services.proxy.events.checks import check_agent_event
from services.proxy.fleet.ledger_gateway import V1_ATTEMPT
from services.proxy.routes.error_shapes import ShapedRoute, openai_shape
from services.proxy.routes.request_body import read_body
from services.proxy.routes.stream_response import ProxyStream
from services.proxy.routes.token_count import count_tokens
from services.proxy.runtime import ProxyRuntime, runtime_of

log = logging.getLogger(__name__)

PREFIX = "/proxy/rollout/{rollout_id}/attempt/{attempt_id}/mode/{mode}/openai/v1"
EVENTS = "/api/rollouts/{rollout_id}/attempt/{attempt_id}/events"
# The refused attempts remembered (oldest forgotten first), so that only an attempt's first refusal is stored.
_REFUSALS_KEPT = 10_000


async def scope_ids(request: Request, runtime: ProxyRuntime) -> tuple[str, str]:
    """The rollout and attempt of an agent route, the caller allowed on them. With the master key, v1.0's
    constant attempt "0" names the rollout's attempt (gateway.v1_attempt); an agent token names only its own."""
    params = request.path_params
    rollout_id, attempt_id = params["rollout_id"], params["attempt_id"]
    presented = presented_key(request.headers)
    runtime.auth.require_rollout(presented, rollout_id, attempt_id)
    serving.trust_connection(request.scope)
    if attempt_id == V1_ATTEMPT and runtime.auth.is_master(presented):
        attempt_id = await runtime.gateway.v1_attempt(rollout_id)
    return rollout_id, attempt_id


async def _model_call(request: Request, api: str, dialect: Dialect | None = None) -> Response:
    runtime = runtime_of(request)
    rollout_id, attempt_id = await scope_ids(request, runtime)
    mode = request.path_params["mode"]
    if mode not in MODES:
        raise ProxyError("not_found", f"Unknown mode {mode!r}: use train or val.")
    raw = await read_body(request, runtime.config.max_body_bytes)
    outcome = await runtime.calls.handle(rollout_id, attempt_id, mode, api, raw, dialect)
    if isinstance(outcome, Reply):
        return Response(outcome.body, status_code=outcome.status, headers=outcome.headers)
    return ProxyStream(outcome)


async def chat(request: Request) -> Response:
    return await _model_call(request, CHAT)


async def completions(request: Request) -> Response:
    return await _model_call(request, COMPLETIONS)


async def messages(request: Request) -> Response:
    return await _model_call(request, anthropic_messages.DIALECT.api, anthropic_messages.DIALECT)


async def responses(request: Request) -> Response:
    return await _model_call(request, openai_responses.DIALECT.api, openai_responses.DIALECT)


async def messages_count_tokens(request: Request) -> Response:
    runtime = runtime_of(request)
    rollout_id, attempt_id = await scope_ids(request, runtime)
    if request.path_params["mode"] not in MODES:
        raise ProxyError("not_found", f"Unknown mode {request.path_params['mode']!r}: use train or val.")
    raw = await read_body(request, runtime.config.max_body_bytes)
    answer = await count_tokens(
        runtime.gateway,
        runtime.routing,
        runtime.upstream.client,
        runtime.config.model_name,
        rollout_id,
        attempt_id,
        raw,
    )
    return JSONResponse(answer)


async def stored_response(request: Request) -> Response:
    """`GET .../responses/{response_id}`: a response of this rollout attempt, answered from its record in the ledger."""
    runtime = runtime_of(request)
    rollout_id, attempt_id = await scope_ids(request, runtime)
    if request.path_params["mode"] not in MODES:
        raise ProxyError("not_found", f"Unknown mode {request.path_params['mode']!r}: use train or val.")
    calls = await runtime.gateway.calls_of(rollout_id, attempt_id)
    chat_request, response = find(calls, request.path_params["response_id"], rollout_id)
    return JSONResponse(openai_responses.from_chat(response, stored_body(chat_request)))


class _MessagesNotServed:
    """The Anthropic API's other paths (batches): a 404 in its shape, which its SDK reads. An ASGI
    app rather than a request handler, so that its route takes every method (a handler's would take GET only)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raise HTTPException(404)


async def models(request: Request) -> Response:
    runtime = runtime_of(request)
    rollout_id, _ = await scope_ids(request, runtime)
    # The model the rollout's calls are routed to (its run's adapter when labelled), which an agent that picks its
    # model from this list then names; the proxy overrides the name in each call either way.
    model = await runtime.gateway.model_of(rollout_id) or runtime.config.model_name
    card = {"id": model, "object": "model", "created": 0, "owned_by": "agl"}
    return JSONResponse({"object": "list", "data": [card]})


async def events(request: Request) -> Response:
    runtime = runtime_of(request)
    rollout_id, attempt_id = await scope_ids(request, runtime)
    master = runtime.auth.is_master(presented_key(request.headers))
    body = parse_body(await read_body(request, runtime.config.max_body_bytes), lenient=True)
    try:
        check_agent_event(body)
        event = agent_event(rollout_id, attempt_id, body, master=master)
    except ProxyError as err:
        await _note_refusal(runtime, rollout_id, attempt_id, err, body)
        raise
    sequence, filed_under = await runtime.gateway.append_filed(event)
    runtime.metrics.events.labels(runtime.metrics.event_type_label(event.event_type)).inc()
    # v1.0 answered with the stored Event (its clients validate `timestamp` and `data`); the time is the
    # proxy's at the acknowledgement, within a millisecond of the ledger's own stamp. An event filed under no
    # attempt (v1.0's "0" on a rollout never claimed) is v1.0's attempt "0".
    answer = {"rollout_id": rollout_id, "attempt_id": filed_under or V1_ATTEMPT, "event_type": event.event_type}
    answer.update(sequence=sequence, timestamp=time.time(), data=body.get("data", {}))
    try:
        return JSONResponse(answer)
    except ValueError:  # data with NaN or Infinity (stored as given): not echoed
        answer["data"] = {}
        return JSONResponse(answer)


async def _note_refusal(runtime: ProxyRuntime, rollout_id: str, attempt_id: str, err: ProxyError, body: Any) -> None:
    """The first refused event of an attempt is stored on the rollout as a warning (best effort)."""
    log.info(
        "rollout %s attempt %s: event refused (%d %s): %s",
        rollout_id,
        attempt_id,
        err.status,
        err.kind,
        printable(str(err)),
    )
    noted = runtime.refusals_noted
    if (rollout_id, attempt_id) in noted:
        return
    noted[(rollout_id, attempt_id)] = None
    while len(noted) > _REFUSALS_KEPT:
        noted.pop(next(iter(noted)))
    posted = body.get("event_type") if isinstance(body, dict) else None
    with contextlib.suppress(ProxyError):  # the rollout finished or the ledger is away: the 422 still answers
        await runtime.gateway.append(refused_event(rollout_id, attempt_id, err, posted))


def routes() -> list[BaseRoute]:
    anthropic = anthropic_messages.DIALECT.error_body
    return [
        ShapedRoute(f"{PREFIX}/chat/completions", chat, methods=["POST"], error_shape=openai_shape),
        ShapedRoute(f"{PREFIX}/completions", completions, methods=["POST"], error_shape=openai_shape),
        ShapedRoute(f"{PREFIX}/models", models, methods=["GET"], error_shape=openai_shape),
        ShapedRoute(f"{PREFIX}/messages", messages, methods=["POST"], error_shape=anthropic),
        ShapedRoute(f"{PREFIX}/messages/count_tokens", messages_count_tokens, methods=["POST"], error_shape=anthropic),
        # Any method; `{name}` needs a character, so `.../messages/` still gets Starlette's redirect to `.../messages`.
        ShapedRoute(f"{PREFIX}/messages/{{name}}{{rest:path}}", _MessagesNotServed(), error_shape=anthropic),
        ShapedRoute(
            f"{PREFIX}/responses", responses, methods=["POST"], error_shape=openai_responses.DIALECT.error_body
        ),
        ShapedRoute(
            f"{PREFIX}/responses/{{response_id}}",
            stored_response,
            methods=["GET"],
            error_shape=openai_responses.DIALECT.error_body,
        ),
        ShapedRoute(EVENTS, events, methods=["POST"], error_shape=openai_shape),
    ]
