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


@dataclass
class _Scan:
    triplets: list[Triplet] = field(default_factory=list)
    reward: float | None = None
    calls: list[CallOutcome] = field(default_factory=list)
    failed_calls: int = 0


def _scan(events: Iterable[event_pb2.Event], counts: Counter[str]) -> _Scan:
    """One pass over a rollout's events: triplets, the last reward, every successful call's outcome, failures."""
    scan = _Scan()
    for event in events:
        kind = event.WhichOneof("payload")
        if kind == "model_request" or (kind is None and event.event_type == MODEL_REQUEST):
            call = event.model_request
            if call.status not in (event_pb2.MODEL_REQUEST_STATUS_OK, event_pb2.MODEL_REQUEST_STATUS_UNSPECIFIED):
                counts[DROPPED_ERROR_CALLS] += 1
                scan.failed_calls += 1
                continue
            scan.calls.append(CallOutcome(call.finish_reason, call.tool_calls if call.HasField("tool_calls") else None))
            response = list(call.response_token_ids)
            if not response:
                counts[DROPPED_EMPTY_RESPONSES] += 1
                continue
            logprobs: list[float] | None = None
            if call.has_response_logprobs and len(call.response_logprobs) == len(response):
                logprobs = list(call.response_logprobs)
            else:
                counts[LOGPROBS_MISSING] += 1
            scan.triplets.append(
                Triplet(
                    prompt_ids=list(call.prompt_token_ids),
                    response_ids=response,
                    logprobs=logprobs,
                    turn_index=len(scan.triplets),
                    model_version=call.model_version,
                )
            )
        elif kind == "reward" and event.reward.HasField("value"):
            scan.reward = event.reward.value
    return scan


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
    scan = _scan(events, counts)
    missing = scan.reward is None
    if missing:
        counts[REWARD_MISSING] += 1
    return RolloutTrace(
        rollout_id=rollout_id,
        group_id=group_id,
        data_id=data_id,
        reward=reward_fillna_value if scan.reward is None else float(scan.reward),
        triplets=scan.triplets,
        reward_missing=missing,
        succeeded=succeeded,
        failed_calls=scan.failed_calls,
        calls=scan.calls,
    )
