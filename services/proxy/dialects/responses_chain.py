"""Responses kept by the ledger: `previous_response_id` within a rollout, and `GET .../responses/{id}`.

Guarantee: a response is found only among the calls recorded for the same rollout attempt (the proxy keeps
nothing itself; every call is already in the ledger before its answer is sent), and only an answer that was
recorded whole (status OK). A chained request is served as the whole conversation would be: the earlier call's
conversation as the engine saw it (its recorded chat messages), its answer as the engine wrote it (text and tool
calls; reasoning left out, as it is when an agent sends reasoning items back), then the new request's input, so
the prompt continues the sampled tokens like a request that sends its whole input. `instructions` are the new
request's: an earlier call's first system turn is replaced when the new request sets instructions, kept otherwise
(the recorded conversation does not say whether it came from instructions or from a developer item). Pure: no I/O.
"""

from __future__ import annotations

import json
from typing import Any

from services._gen.agl.v1 import event_pb2
from services.proxy.dialects.translation import RESPONSES, first_choice, require
from services.proxy.errors import ProxyError

OK = event_pb2.MODEL_REQUEST_STATUS_OK


def response_id(chat_id: Any) -> str:
    """The Responses id of an answer, from the engine's chat completion id ("" when it has none)."""
    if isinstance(chat_id, str) and chat_id:
        return "resp_" + chat_id.removeprefix("chatcmpl-")
    return ""


def earlier_id(body: dict[str, Any]) -> str:
    """The response a Responses request continues ("" none); 400 when it is not a string."""
    value = body.get("previous_response_id")
    if value is None or value == "":
        return ""
    require(isinstance(value, str), "`previous_response_id` must be a string.")
    return value


def find(calls: list[Any], wanted: str, rollout_id: str, field: str = "") -> tuple[dict, dict]:
    """(the recorded chat request, the recorded chat response) of response `wanted` among a rollout attempt's
    recorded calls (ModelRequest messages); else 404, or 400 naming `field` for a request that names it (as
    OpenAI answers both)."""
    for call in reversed(calls):
        if call.api != RESPONSES or call.status != OK:
            continue
        try:
            response = json.loads(call.response_json)
        except ValueError:
            continue
        if isinstance(response, dict) and response_id(response.get("id")) == wanted:
            return json.loads(call.request_json), response
    where = f"`{field}`: " if field else ""
    raise ProxyError(
        "invalid_request" if field else "not_found",
        f"{where}Response {wanted!r} was not made in this rollout attempt (responses are kept per rollout attempt, "
        f"in the ledger; rollout {rollout_id}).",
    )


def _answer(response: dict[str, Any]) -> dict[str, Any]:
    """The engine's answer as the assistant turn the next prompt holds."""
    message = first_choice(response).get("message") or {}
    turn: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    calls = [
        {"id": call.get("id"), "type": "function", "function": call.get("function") or {}}
        for call in message.get("tool_calls") or ()
        if isinstance(call, dict)
    ]
    if calls:
        turn["tool_calls"] = calls
    return turn


def chained(earlier: tuple[dict, dict], chat: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """The chat request of a Responses request that continues `earlier` (find()'s pair); `chat` is the request's
    own translation, `body` the agent's request."""
    request, response = earlier
    before = [dict(message) for message in request.get("messages") or ()]
    new = list(chat["messages"])
    instructions = body.get("instructions")
    if instructions:  # the new request's instructions (its first message) replace the earlier call's
        if before and before[0].get("role") == "system":
            before = before[1:]
        return {**chat, "messages": [new[0], *before, _answer(response), *new[1:]]}
    return {**chat, "messages": [*before, _answer(response), *new]}


def stored_body(request: dict[str, Any]) -> dict[str, Any]:
    """A Responses request standing for a recorded call's (its chat translation): what from_chat reads of it to
    answer `GET .../responses/{id}`. Function tools keep their names; custom and namespaced tools come back as the
    functions the engine was offered."""
    tools = [
        {"type": "function", **tool["function"]}
        for tool in request.get("tools") or ()
        if isinstance(tool, dict) and isinstance(tool.get("function"), dict)
    ]
    body: dict[str, Any] = {"tools": tools} if tools else {}
    for name, field in (("max_tokens", "max_output_tokens"), ("temperature", "temperature"), ("top_p", "top_p")):
        if request.get(name) is not None:
            body[field] = request[name]
    return body
