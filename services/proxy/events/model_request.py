"""A `model_request` event posted in Agent Lightning v1.0's shape -> the ledger's ModelRequest (pure).

v1.0's gateway wrote each call as `data` = {model, model_version, request, response, server: {model, endpoint,
version}, latency_ms, http_status, status, retry_count, usage, finish_reason}, with the token ids inside the
engine's response: `response.prompt_token_ids` (chat) or `response.choices[0].prompt_token_ids` (completions),
`response.choices[0].token_ids`, log-probs in `choices[0].logprobs` (chat `content[].logprob` or completions
`token_logprobs`); an older gateway stored a stream as its list of raw chunks. An importer or a test that writes
calls this way gets the same stored event as a call the proxy recorded, so the triplet view, the trainer and the
console read it alike.

What v1.0 stored unread is refused here with a 422 naming the field (token ids that are not integers of 64 bits,
a `data` that is not an object), so nothing reaches the ledger that the training path would misread. Log-probs
that are missing, not finite or not numbers give `has_response_logprobs` false (v1.0's null), never an error.
v1.0's `routed_experts` (MoE routing replay) is not kept: AGL does not replay routes.
"""

from __future__ import annotations

import json
import math
from typing import Any

from services._gen.agl.v1 import event_pb2
from services.proxy.call.tool_calls import offered_tool_names, tool_call_stats
from services.proxy.errors import ProxyError

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_INT32_MAX = 2**31 - 1
_STATUSES = {
    "ok": event_pb2.MODEL_REQUEST_STATUS_OK,
    "error": event_pb2.MODEL_REQUEST_STATUS_ERROR,
    "incomplete": event_pb2.MODEL_REQUEST_STATUS_INCOMPLETE,
}
_USAGE_FIELDS = ("prompt_tokens", "completion_tokens", "total_tokens")


def _refuse(field: str, what: str) -> ProxyError:
    return ProxyError("invalid_event", f"`data.{field}` {what} (a model_request in Agent Lightning v1.0's shape).")


def _token_ids(value: Any, field: str) -> list[int]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _refuse(field, "must be a list of token ids")
    for k, token in enumerate(value):
        if isinstance(token, bool) or not isinstance(token, int) or not _INT64_MIN <= token <= _INT64_MAX:
            raise _refuse(f"{field}[{k}]", f"must be an integer of 64 bits, not {json.dumps(token)[:40]}")
    return value


def _choice_log_probs(choice: dict[str, Any]) -> list[float] | None:
    """The chosen tokens' log-probs of a choice, or None when absent or unusable (as v1.0's triplet view has it)."""
    logprobs = choice.get("logprobs")
    if not isinstance(logprobs, dict):
        return None
    if isinstance(logprobs.get("content"), list):
        items = logprobs["content"]
        if not all(isinstance(item, dict) and "logprob" in item for item in items):
            return None
        raw = [item["logprob"] for item in items]
    elif isinstance(logprobs.get("token_logprobs"), list):
        raw = logprobs["token_logprobs"]
    else:
        return None
    out: list[float] = []
    for value in raw:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            return None
        out.append(float(value))
    return out


def _first_choice(response: dict[str, Any]) -> dict[str, Any]:
    choices = response.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return choices[0]
    return {}


def _tokens(response: Any) -> tuple[list[int], list[int], list[float] | None, dict[str, Any]]:
    """(prompt ids, response ids, log-probs or None, first choice) of v1.0's response: a body or a chunk list."""
    if isinstance(response, dict):
        choice = _first_choice(response)
        if response.get("prompt_token_ids"):
            prompt_ids = _token_ids(response["prompt_token_ids"], "response.prompt_token_ids")
        else:
            prompt_ids = _token_ids(choice.get("prompt_token_ids"), "response.choices[0].prompt_token_ids")
        response_ids = _token_ids(choice.get("token_ids"), "response.choices[0].token_ids")
        return prompt_ids, response_ids, _choice_log_probs(choice), choice
    if isinstance(response, list):  # an older gateway's raw stream chunks
        prompt_ids: list[int] = []
        response_ids: list[int] = []
        for k, chunk in enumerate(response):
            if not isinstance(chunk, dict):
                continue
            if not prompt_ids and chunk.get("prompt_token_ids"):
                prompt_ids = _token_ids(chunk["prompt_token_ids"], f"response[{k}].prompt_token_ids")
            ids = _first_choice(chunk).get("token_ids")
            if ids:
                response_ids.extend(_token_ids(ids, f"response[{k}].choices[0].token_ids"))
        return prompt_ids, response_ids, None, {}
    if response is not None:
        raise _refuse("response", "must be the engine's response object (or its list of stream chunks)")
    return [], [], None, {}


def _int(data: dict[str, Any], name: str, most: int = _INT64_MAX, where: str = "") -> int:
    value = data.get(name)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= most:
        raise _refuse(where + name, f"must be a non-negative integer up to {most}")
    return value


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _json_text(value: Any, field: str) -> str:
    if value is None:
        return ""
    try:
        return json.dumps(value)
    except (RecursionError, ValueError):
        raise _refuse(field, "is nested too deeply to be stored") from None


def _api(response: Any, choice: dict[str, Any]) -> str:
    kind = response.get("object") if isinstance(response, dict) else None
    if kind in ("chat.completion", "chat.completion.chunk") or "message" in choice:
        return "chat.completions"
    if kind == "text_completion" or "text" in choice:
        return "completions"
    return ""


def model_request_fields(data: Any) -> dict[str, Any]:
    """The ModelRequest (as keyword values) for the `data` of a v1.0 model_request event; 422 when unusable."""
    if not isinstance(data, dict):
        raise ProxyError("invalid_event", "A model_request's `data` must be an object (Agent Lightning v1.0's shape).")
    response = data.get("response")
    prompt_ids, response_ids, logprobs, choice = _tokens(response)
    server = data.get("server") if isinstance(data.get("server"), dict) else {}
    status_name = data.get("status", "ok")
    http_status = _int(data, "http_status", 999)
    if status_name not in _STATUSES:
        raise _refuse("status", f"must be one of {', '.join(_STATUSES)}, not {json.dumps(status_name)[:40]}")
    version = server.get("version", data.get("model_version"))
    if version is None:
        version = 0
    if isinstance(version, bool) or not isinstance(version, int) or not _INT64_MIN <= version <= _INT64_MAX:
        raise _refuse("server.version", "must be an integer")
    latency_ms = data.get("latency_ms")
    if latency_ms is None:
        latency_ms = 0
    if isinstance(latency_ms, bool) or not isinstance(latency_ms, int | float) or not math.isfinite(latency_ms):
        raise _refuse("latency_ms", "must be a finite number")
    request = data.get("request")
    fields: dict[str, Any] = {
        "request_json": _json_text(request, "request"),
        "response_json": _json_text(response, "response"),
        "prompt_token_ids": prompt_ids,
        "response_token_ids": response_ids,
        "response_logprobs": logprobs or (),
        "has_response_logprobs": logprobs is not None,
        "model": _text(server.get("model")) or _text(data.get("model")),
        "model_version": version,
        "endpoint": _text(server.get("endpoint")),
        "latency_seconds": latency_ms / 1000,
        "http_status": http_status,
        "retry_count": _int(data, "retry_count", _INT32_MAX),
        "finish_reason": _text(data.get("finish_reason")) or _text(choice.get("finish_reason")),
        "status": _STATUSES[status_name],
        "api": _api(response, choice),
    }
    usage = data.get("usage")
    if isinstance(usage, dict):
        fields["usage"] = {name: _int(usage, name, where="usage.") for name in _USAGE_FIELDS}
    offered = offered_tool_names(request) if isinstance(request, dict) else None
    message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    calls = message.get("tool_calls") if isinstance(message.get("tool_calls"), list) else []
    stats = tool_call_stats(offered, message.get("content") or choice.get("text"), calls)
    if stats is not None:
        fields["tool_calls"] = stats
    return fields
