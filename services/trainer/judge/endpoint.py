"""The judge's one HTTP call: OpenAI-compatible `POST {base_url}/chat/completions` (an external service, or the run's
own engine's `/v1`).

Every failure of the call (no connection, a timeout, an HTTP error status, a body that is no chat completion) is
raised as JudgeEndpointError with the URL and what went wrong; callers never see httpx's own exceptions. The key is
sent as a bearer token and never appears in a message.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx


class JudgeEndpointError(RuntimeError):
    """The judge's endpoint gave no usable answer."""


@dataclass(frozen=True)
class JudgeReply:
    text: str
    prompt_tokens: int
    completion_tokens: int
    model: str


def chat_url(base_url: str) -> str:
    return base_url.rstrip("/") + "/chat/completions"


async def chat(
    client: httpx.AsyncClient,
    base_url: str,
    model: str,
    messages: Sequence[dict[str, str]],
    *,
    api_key: str | None,
    max_tokens: int,
    timeout_s: float,
) -> JudgeReply:
    """One chat completion at temperature 0."""
    url = chat_url(base_url)
    body: dict[str, Any] = {"model": model, "messages": list(messages), "temperature": 0.0, "max_tokens": max_tokens}
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = await client.post(url, json=body, headers=headers, timeout=timeout_s)
    except httpx.TimeoutException:
        raise JudgeEndpointError(f"judge endpoint {url}: no answer within {timeout_s:g} s") from None
    except httpx.HTTPError as err:
        raise JudgeEndpointError(f"judge endpoint {url}: {type(err).__name__}: {err}") from None
    if response.status_code != 200:
        excerpt = " ".join(response.text.split())[:200]
        raise JudgeEndpointError(f"judge endpoint {url}: HTTP {response.status_code}: {excerpt}")
    try:
        payload = response.json()
        message = payload["choices"][0]["message"]
        text = message.get("content") or ""
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        raise JudgeEndpointError(f"judge endpoint {url}: the answer is not a chat completion") from None
    usage = payload.get("usage") if isinstance(payload.get("usage"), dict) else {}
    return JudgeReply(
        text=str(text),
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        model=str(payload.get("model") or model),
    )
