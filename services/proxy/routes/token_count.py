"""Anthropic's `POST .../v1/messages/count_tokens`, answered with the engine's own tokenizer and chat template.

Guarantee: the count is the length of the prompt that a Messages call with the same body would send the engine
(translated the same way, system turns, tools and thinking included; vLLM's `POST /tokenize`), on the engine the
rollout's calls go to. Nothing is generated and nothing is recorded: it is not a model call.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx
import orjson

from services.proxy.call.rewrite import parse_body
from services.proxy.dialects import anthropic_messages
from services.proxy.engines.model_tables import ModelRoutes, requested_model
from services.proxy.engines.routing import Endpoint
from services.proxy.errors import ProxyError
from services.proxy.fleet.ledger_gateway import LedgerGateway

log = logging.getLogger(__name__)


def _tokenize_url(endpoint: Endpoint) -> str:
    """vLLM serves /tokenize at its root, beside /v1."""
    url = endpoint.url.rstrip("/")
    return f"{url.removesuffix('/v1')}/tokenize"


async def count_tokens(
    gateway: LedgerGateway,
    routing: ModelRoutes,
    client: httpx.AsyncClient,
    default_model: str,
    rollout_id: str,
    attempt_id: str,
    raw: bytes,
) -> dict[str, Any]:
    """Anthropic's answer, {"input_tokens": N}; a ProxyError where the request or the engine says no."""
    body = parse_body(raw)
    models = await gateway.check_rollout(rollout_id, attempt_id)
    model, _ = models.route(requested_model(body), models.model or default_model)
    request = anthropic_messages.to_tokenize(body, model)
    endpoints = routing.table(model).ranked(rollout_id)
    if not endpoints:
        raise ProxyError("no_endpoint", f"No engine endpoint is registered for model {model}.")
    url = _tokenize_url(endpoints[0])
    try:
        reply = await client.post(url, content=orjson.dumps(request))
    except httpx.TimeoutException as err:
        raise ProxyError("upstream_timeout", f"The engine did not answer /tokenize in time: {err}") from None
    except httpx.HTTPError as err:
        raise ProxyError("upstream_unreachable", f"The engine could not be reached: {type(err).__name__}") from None
    if reply.status_code == 400:
        raise ProxyError("invalid_request", f"The engine refused to tokenize the request: {_engine_message(reply)}")
    if reply.status_code != 200:
        log.warning("rollout %s: %s answered %d: %s", rollout_id, url, reply.status_code, reply.text[:300])
        raise ProxyError("upstream_unreachable", f"The engine's /tokenize answered {reply.status_code}.")
    try:
        count = reply.json()["count"]
    except (ValueError, KeyError, TypeError):
        raise ProxyError("upstream_unreachable", "The engine's /tokenize answer has no `count`.") from None
    return {"input_tokens": int(count)}


def _engine_message(reply: httpx.Response) -> str:
    try:
        return str(reply.json()["error"]["message"])[:500]
    except (ValueError, KeyError, TypeError):
        return reply.text[:500]
