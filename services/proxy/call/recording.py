"""The model_request event the proxy appends for each model call it forwarded."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from services._gen.agl.v1 import event_pb2
from services.proxy.call.capture import Capture

OK = event_pb2.MODEL_REQUEST_STATUS_OK
ERROR = event_pb2.MODEL_REQUEST_STATUS_ERROR
INCOMPLETE = event_pb2.MODEL_REQUEST_STATUS_INCOMPLETE


@dataclass
class CallRecord:
    """Everything known about one model call once it has ended."""

    rollout_id: str
    attempt_id: str
    api: str
    stream: bool
    request_json: str
    response_json: str
    capture: Capture
    endpoint: str
    model_version: int
    latency_s: float
    http_status: int
    retry_count: int
    status: int
    # ToolCallStats fields (see call/tool_calls.py), or None when there was nothing to count.
    tool_calls: dict[str, int] | None = None
    # What the proxy left out of or changed in the agent's request (ModelRequest.warnings).
    warnings: tuple[str, ...] = ()
    # An output-token limit the engine lowered to fit its context: what was asked, what was granted (0: none).
    requested_max_tokens: int = 0
    granted_max_tokens: int = 0
    # The model name the agent's request sent, and whose call it was by the rollout's role map (ModelRequestRole).
    requested_model: str = ""
    role: int = 0


_USAGE_FIELDS = ("prompt_tokens", "completion_tokens", "total_tokens")


def model_request_event(record: CallRecord) -> event_pb2.Event:
    capture = record.capture
    # The ModelRequest goes in as keyword values rather than as a message: a message would be built, then copied.
    request: dict[str, Any] = {
        "request_json": record.request_json,
        "response_json": record.response_json,
        "prompt_token_ids": capture.prompt_token_ids,
        "response_token_ids": capture.response_token_ids,
        "response_logprobs": capture.response_logprobs if capture.has_logprobs else (),
        "has_response_logprobs": capture.has_logprobs,
        "model": capture.model,
        "model_version": record.model_version,
        "endpoint": record.endpoint,
        "latency_seconds": record.latency_s,
        "http_status": record.http_status,
        "retry_count": record.retry_count,
        "finish_reason": capture.finish_reason,
        "status": record.status,
        "api": record.api,
        "stream": record.stream,
    }
    if capture.usage is not None:
        request["usage"] = {name: capture.usage[name] for name in _USAGE_FIELDS}
    if record.tool_calls is not None:
        request["tool_calls"] = record.tool_calls
    if record.warnings:
        request["warnings"] = record.warnings
    if record.requested_max_tokens:
        request["requested_max_tokens"] = record.requested_max_tokens
        request["granted_max_tokens"] = record.granted_max_tokens
    if record.requested_model:
        request["requested_model"] = record.requested_model
    if record.role:
        request["role"] = record.role
    return event_pb2.Event(
        rollout_id=record.rollout_id,
        attempt_id=record.attempt_id,
        event_type="model_request",
        model_request=request,
    )
