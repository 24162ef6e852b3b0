"""Triplets: the trainable (prompt tokens, response tokens, log-probs) calls of one finished rollout.

Pure: reads the triplet-view events that arrive with a terminal-stream entry and returns plain Python
objects. One triplet per successful `model_request` with a non-empty response; the rollout's last reward
is attached (missing -> the fill value). Every drop is counted in the caller's Counter.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from services._gen.agl.v1 import event_pb2

MODEL_REQUEST = "model_request"
REWARD = "reward"

# Counter keys (reported as metrics under agl/data/...).
DROPPED_ERROR_CALLS = "dropped_error_calls"
DROPPED_EMPTY_RESPONSES = "dropped_empty_responses"
LOGPROBS_MISSING = "logprobs_missing_calls"
REWARD_MISSING = "reward_missing"


@dataclass(frozen=True)
class Triplet:
    """One model call usable for training."""

    prompt_ids: list[int]
    response_ids: list[int]
    # Aligned with response_ids, or None when the engine gave none (or a count that does not match).
    logprobs: list[float] | None
    turn_index: int
    model_version: int = 0
    finish_reason: str = ""
    # ToolCallStats of the call (the proxy's counts), or None when it offered no tools and made no call.
    tool_calls: event_pb2.ToolCallStats | None = None


@dataclass(frozen=True)
class CallOutcome:
    """How one successful model call ended, whether or not it carried tokens (validation calls do not)."""

    finish_reason: str
    # ToolCallStats of the call, or None when it offered no tools and made no call.
    tool_calls: event_pb2.ToolCallStats | None


@dataclass
class RolloutTrace:
    """A finished rollout reduced to what the data path needs."""

    rollout_id: str
    group_id: str
    data_id: str
    reward: float
    triplets: list[Triplet] = field(default_factory=list)
    reward_missing: bool = False
    succeeded: bool = True
    # Model calls that ended in an error (the engine's or the transport's): not triplets, but part of the story.
    failed_calls: int = 0
    # Every successful call, in order (the triplets are those of them with tokens to train on).
    calls: list[CallOutcome] = field(default_factory=list)


def extract_triplets(events: Iterable[event_pb2.Event], counts: Counter[str]) -> tuple[list[Triplet], float | None]:
    """Triplets in event order and the last reward value (None when the rollout posted no reward); each call
    dropped is counted in `counts`."""
    triplets: list[Triplet] = []
    reward: float | None = None
    for event in events:
        kind = event.WhichOneof("payload")
        if kind == "model_request" or (kind is None and event.event_type == MODEL_REQUEST):
            call = event.model_request
            if call.status not in (event_pb2.MODEL_REQUEST_STATUS_OK, event_pb2.MODEL_REQUEST_STATUS_UNSPECIFIED):
                counts[DROPPED_ERROR_CALLS] += 1
                continue
            response = list(call.response_token_ids)
            if not response:
                counts[DROPPED_EMPTY_RESPONSES] += 1
                continue
            logprobs: list[float] | None = None
            if call.has_response_logprobs and len(call.response_logprobs) == len(response):
                logprobs = list(call.response_logprobs)
            else:
                counts[LOGPROBS_MISSING] += 1
            triplets.append(
                Triplet(
                    prompt_ids=list(call.prompt_token_ids),
                    response_ids=response,
                    logprobs=logprobs,
                    turn_index=len(triplets),
                    model_version=call.model_version,
                    finish_reason=call.finish_reason,
                    tool_calls=call.tool_calls if call.HasField("tool_calls") else None,
                )
            )
        elif kind == "reward" and event.reward.HasField("value"):
            reward = event.reward.value
    return triplets, reward


def trace_from_events(
    rollout_id: str,
    group_id: str,
    data_id: str,
    events: Iterable[event_pb2.Event],
    *,
    reward_fillna_value: float,
    counts: Counter[str],
    succeeded: bool = True,
) -> RolloutTrace:
    """Builds a RolloutTrace; a missing reward becomes reward_fillna_value and is counted."""
    events = list(events)
    failed_before = counts[DROPPED_ERROR_CALLS]
    triplets, reward = extract_triplets(events, counts)
    missing = reward is None
    if missing:
        counts[REWARD_MISSING] += 1
    return RolloutTrace(
        rollout_id=rollout_id,
        group_id=group_id,
        data_id=data_id,
        reward=reward_fillna_value if reward is None else float(reward),
        triplets=triplets,
        reward_missing=missing,
        succeeded=succeeded,
        failed_calls=counts[DROPPED_ERROR_CALLS] - failed_before,
        calls=call_outcomes(events),
    )


def call_outcomes(events: Iterable[event_pb2.Event]) -> list[CallOutcome]:
    """The outcome of every successful model_request among events, in order."""
    ok = (event_pb2.MODEL_REQUEST_STATUS_OK, event_pb2.MODEL_REQUEST_STATUS_UNSPECIFIED)
    return [
        CallOutcome(
            e.model_request.finish_reason,
            e.model_request.tool_calls if e.model_request.HasField("tool_calls") else None,
        )
        for e in events
        if e.event_type == MODEL_REQUEST
        and e.WhichOneof("payload") in ("model_request", None)
        and e.model_request.status in ok
    ]
