"""Limits on how much output one model call may ask for, checked on the agent's request before anything reaches
an engine.

An agent picks `n` and its output-token limit freely; the probe saw one call with `n=100000` keep an engine busy,
store a 65.6 MB event and stall the ledger for everyone. Each API spells these fields its own way, so they are
checked in the agent's own spelling and a refusal (400 `over_request_limit`, in that API's error shape) names the
field, its value, the limit and the setting that sets it. Values that are not numbers are left to the request's
own checks, which say what the field must be.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from services.proxy.call.rewrite import CHAT, COMPLETIONS
from services.proxy.dialects.translation import MESSAGES, RESPONSES
from services.proxy.errors import ProxyError

MAX_N_SETTING = ("--max-n", "AGL_PROXY_MAX_N")
MAX_OUTPUT_TOKENS_SETTING = ("--max-output-tokens", "AGL_PROXY_MAX_OUTPUT_TOKENS")

# Per API: the fields that ask for several answers in one call, and those that bound each answer's tokens.
# Anthropic Messages and Responses have no `n`; completions' `best_of` makes the engine sample that many.
CHOICE_FIELDS = {CHAT: ("n",), COMPLETIONS: ("n", "best_of"), MESSAGES: (), RESPONSES: ()}
TOKEN_FIELDS = {
    CHAT: ("max_tokens", "max_completion_tokens"),
    COMPLETIONS: ("max_tokens",),
    MESSAGES: ("max_tokens",),
    RESPONSES: ("max_output_tokens",),
}


@dataclass(frozen=True)
class RequestLimits:
    max_n: int = 64
    max_output_tokens: int = 131_072

    def check(self, body: dict[str, Any], api: str) -> None:
        """Raise ProxyError 400 for the first field of `api` in `body` over its limit."""
        for name in CHOICE_FIELDS[api]:
            _check(body, name, self.max_n, MAX_N_SETTING)
        for name in TOKEN_FIELDS[api]:
            _check(body, name, self.max_output_tokens, MAX_OUTPUT_TOKENS_SETTING)


def _check(body: dict[str, Any], name: str, limit: int, setting: tuple[str, str]) -> None:
    value = body.get(name)
    if isinstance(value, int | float) and not isinstance(value, bool) and value > limit:
        flag, env = setting
        raise ProxyError(
            "over_request_limit",
            f"`{name}` is {value}, over this proxy's limit of {limit:,} ({flag}, {env}); nothing was sent to the "
            "model.",
        )
