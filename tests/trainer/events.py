"""Builders of triplet-view events for the trainer tests and benchmark."""

from __future__ import annotations

from collections.abc import Sequence

from services._gen.agl.v1 import event_pb2


def call(
    prompt: Sequence[int],
    response: Sequence[int],
    logprobs: Sequence[float] | None = None,
    status: int = event_pb2.MODEL_REQUEST_STATUS_OK,
    http_status: int = 0,
    model_version: int = 0,
) -> event_pb2.Event:
    request = event_pb2.ModelRequest(
        prompt_token_ids=prompt, response_token_ids=response, status=status, http_status=http_status,
        model_version=model_version,
    )  # fmt: skip
    if logprobs is not None:
        request.response_logprobs.extend(logprobs)
        request.has_response_logprobs = True
    return event_pb2.Event(event_type="model_request", model_request=request)


def reward(value: float) -> event_pb2.Event:
    return event_pb2.Event(event_type="reward", reward=event_pb2.Reward(value=value))
