"""Output-token limits that fit the engine's context, whatever the agent asks for.

Harnesses ask for a fixed large output (Claude Code sends `max_tokens` 32,000-64,000) whatever the model; against an
engine with a short context vLLM refuses the call (`max_tokens=32000 cannot be greater than max_model_len=512`).
vLLM (0.32) lowers any limit up to max_model_len to what the prompt leaves (max_model_len less the prompt's tokens)
on its own, so only a limit above max_model_len needs changing: the call is sent with max_model_len, the engine
grants what the prompt leaves, and the call's record holds what the agent asked for and what the engine granted
(the prompt's length is known from the engine's answer; no extra tokenize request). A call that asked for no more
than fits is sent and recorded as it was.

The engine's max_model_len is its GET /v1/models answer's `max_model_len` for the served model, read once per
endpoint on the first call that sets a limit, and again after RECHECK_S; an engine that does not say (or cannot be
asked) gets the call unchanged. The proxy's own abuse limit (--max-output-tokens) is checked before this, on the
agent's own fields: a request over it is still a 400.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import httpx

from services.proxy.engines.routing import Endpoint

log = logging.getLogger(__name__)

# The engine's fields that bound one answer's tokens (chat completions and completions; every dialect's request is
# translated to chat completions before it gets here).
LIMIT_FIELDS = ("max_tokens", "max_completion_tokens")
RECHECK_S = 300.0
UNKNOWN_RECHECK_S = 30.0
PROBE_TIMEOUT_S = 5.0


def requested_limit(body: dict[str, Any]) -> int | None:
    """The largest output-token limit the engine's request sets, or None."""
    limits = [v for v in (body.get(name) for name in LIMIT_FIELDS) if isinstance(v, int) and not isinstance(v, bool)]
    return max(limits) if limits else None


def fit(body: dict[str, Any], max_model_len: int) -> bool:
    """Lowers every limit of `body` above `max_model_len` to it (in place); whether any was lowered."""
    lowered = False
    for name in LIMIT_FIELDS:
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and max_model_len > 0 and value > max_model_len:
            body[name] = max_model_len
            lowered = True
    return lowered


def granted(max_model_len: int, prompt_tokens: int) -> int:
    """The output tokens an engine of `max_model_len` positions can give after a prompt of `prompt_tokens`."""
    return max(0, max_model_len - prompt_tokens)


def served_max_model_len(models: Any, model: str) -> int | None:
    """`max_model_len` of `model` (else of the first model listed) in a GET /v1/models answer."""
    data = models.get("data") if isinstance(models, dict) else None
    if not isinstance(data, list):
        return None
    cards = [card for card in data if isinstance(card, dict)]
    chosen = next((card for card in cards if card.get("id") == model), cards[0] if cards else None)
    value = chosen.get("max_model_len") if chosen is not None else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


class ContextLengths:
    """Each endpoint's max_model_len, asked of the engine and remembered for a while."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self._client = client
        self._known: dict[tuple[str, str], tuple[int | None, float]] = {}  # (url, model) -> (length, read at)

    async def of(self, endpoint: Endpoint, model: str) -> int | None:
        key = (endpoint.url, model)
        known = self._known.get(key)
        now = time.monotonic()
        if known is not None and now - known[1] < (RECHECK_S if known[0] is not None else UNKNOWN_RECHECK_S):
            return known[0]
        length = await self._ask(endpoint, model)
        if len(self._known) > 4096:
            self._known.clear()
        self._known[key] = (length, now)
        return length

    async def _ask(self, endpoint: Endpoint, model: str) -> int | None:
        url = endpoint.url.rstrip("/") + "/models"
        try:
            response = await self._client.get(url, timeout=PROBE_TIMEOUT_S)
            length = served_max_model_len(response.json(), model) if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError) as err:
            log.warning("engine %s: could not read its max_model_len from %s: %s", endpoint.url, url, err)
            return None
        if length is None:
            log.info("engine %s: %s names no max_model_len; output limits are sent as asked", endpoint.url, url)
        return length
