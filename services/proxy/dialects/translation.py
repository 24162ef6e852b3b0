"""What the proxy needs to serve an agent API by translating it to the engine's chat completions.

The Anthropic Messages API and the OpenAI Responses API are served this way: the agent's request becomes a chat
completions request (then rewritten like any other: model, temperature, token ids and log-probs forced), the
engine's chat answer is captured by the chat capture path, and the answer is translated back into the agent's
API. Streams are translated chunk by chunk. A Dialect bundles the four translations of one API.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from services.proxy.errors import ProxyError

MESSAGES = "anthropic.messages"
RESPONSES = "openai.responses"


class StreamTranslator(Protocol):
    """Turns the engine's chat stream chunks (parsed) into the agent API's stream, as bytes to send."""

    def feed(self, chunk: dict[str, Any]) -> bytes: ...

    def finish(self, assembled: dict[str, Any]) -> bytes:
        """The closing events, given the chat response assembled from the whole stream."""
        ...

    def error(self, err: ProxyError) -> bytes: ...


@dataclass(frozen=True)
class Dialect:
    api: str
    # The agent's request (checked: ProxyError 400 when it cannot be translated) -> a chat completions body.
    to_chat: Callable[[dict[str, Any]], dict[str, Any]]
    # (the engine's chat response, the agent's request) -> the agent API's response body.
    from_chat: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]
    # The agent's request -> a translator for one stream.
    stream: Callable[[dict[str, Any]], StreamTranslator]
    # An error body of the engine or the proxy (OpenAI-shaped) and its HTTP status -> the agent API's error body.
    error_body: Callable[[dict[str, Any], int], dict[str, Any]]
    # The agent's (checked) request -> what the translation left out of it or changed, one sentence each: recorded
    # with the call (ModelRequest.warnings) and logged.
    warnings: Callable[[dict[str, Any]], list[str]] | None = None
    # The agent's request -> the id of an earlier response it continues ("": none; the Responses API's
    # previous_response_id). The proxy finds that call among the rollout attempt's recorded calls, then
    # chain((its recorded chat request, its recorded chat response), the request's chat body, the agent's request)
    # gives the chat body to send.
    earlier: Callable[[dict[str, Any]], str] | None = None
    chain: Callable[[tuple[dict[str, Any], dict[str, Any]], dict[str, Any], dict[str, Any]], dict[str, Any]] | None = (
        None
    )


def sse(event: str, data: dict[str, Any]) -> bytes:
    """One server-sent event with a name, as the Anthropic and Responses streams send them."""
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def openai_error_parts(body: dict[str, Any]) -> tuple[str, str]:
    """(message, code or type) of an OpenAI-shaped error body; tolerant of other shapes."""
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        return str(error.get("message") or ""), str(error.get("code") or error.get("type") or "")
    if isinstance(error, str):
        return error, ""
    return str(body), ""


def parse_arguments(arguments: str) -> Any:
    """A tool call's arguments text as JSON (what Anthropic's `input` holds); {} when it is not JSON."""
    if not arguments:
        return {}
    try:
        return orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return {}


def first_choice(response: dict[str, Any]) -> dict[str, Any]:
    choices = response.get("choices")
    if isinstance(choices, list):
        for choice in choices:
            if isinstance(choice, dict) and choice.get("index", 0) == 0:
                return choice
    return {}


def require(condition: bool, message: str) -> None:
    if not condition:
        raise ProxyError("invalid_request", message)
