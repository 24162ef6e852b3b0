"""Triplets: the trainable (prompt tokens, response tokens, log-probs) calls of one finished rollout.

Pure: reads the triplet-view events that arrive with a terminal-stream entry and returns plain Python
objects. One triplet per successful `model_request` of the rollout's own policy with a non-empty response; the
rollout's last reward is attached (missing -> the fill value). Every drop is counted in the caller's Counter. The
ledger's view has already kept one call per distinct prompt (its contract to every consumer; why the rule is
split so: services/ledger/triplet.py).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from services._gen.agl.v1 import event_pb2

MODEL_REQUEST = "model_request"
REWARD = "reward"

# Counter keys (reported as metrics under agl/data/...).
DROPPED_ERROR_CALLS = "dropped_error_calls"
DROPPED_EMPTY_RESPONSES = "dropped_empty_responses"
LOGPROBS_MISSING = "logprobs_missing_calls"
REWARD_MISSING = "reward_missing"
OTHER_ROLE_CALLS = "other_role_calls"

# The roles whose calls this run does not train: another policy's, a frozen one's.
_OTHER_ROLES = frozenset({event_pb2.MODEL_REQUEST_ROLE_OTHER_POLICY, event_pb2.MODEL_REQUEST_ROLE_FROZEN})


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


@dataclass(frozen=True)
class CallText:
    """One model call as text, read from the full event (validation calls carry no token ids to decode)."""

    prompt: str
    response: str
    prompt_tokens: int
    response_tokens: int
    model_version: int
    finish_reason: str
    ok: bool


def _loads(text: str) -> Any:
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def _message_text(message: Any) -> str:
    if not isinstance(message, dict):
        return ""
    content = message.get("content")
    if isinstance(content, list):  # content parts
        content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    text = f"{message.get('role', '?')}: {content or ''}"
    for call in message.get("tool_calls") or []:
        function = call.get("function", {}) if isinstance(call, dict) else {}
        text += f"\n[tool call {function.get('name', '')}({function.get('arguments', '')})]"
    return text


def call_text(call: event_pb2.ModelRequest) -> CallText:
    """The request's messages (or prompt) and the answer's message (or text) of a recorded call."""
    request, response = _loads(call.request_json), _loads(call.response_json)
    prompt = ""
    if isinstance(request, dict):
        if isinstance(request.get("messages"), list):
            prompt = "\n".join(_message_text(m) for m in request["messages"])
        elif "prompt" in request:
            prompt = str(request["prompt"])
    answer = call.response_json
    choices = response.get("choices") if isinstance(response, dict) else None
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        first = choices[0]
        answer = (
            _message_text(first["message"]) if isinstance(first.get("message"), dict) else str(first.get("text", ""))
        )
    ok = call.status in (event_pb2.MODEL_REQUEST_STATUS_OK, event_pb2.MODEL_REQUEST_STATUS_UNSPECIFIED)
    return CallText(
        prompt=prompt,
        response=answer,
        prompt_tokens=call.usage.prompt_tokens or len(call.prompt_token_ids),
        response_tokens=call.usage.completion_tokens or len(call.response_token_ids),
        model_version=call.model_version,
        finish_reason=call.finish_reason,
        ok=ok,
    )


# A rollout that failed for what looks like the agent's reason (it exited non-zero, raised) right after the proxy
# answered its last model call 502, 503 or 504 (the engine unreachable, dead mid-answer, every engine held back as
# restarted or overloaded, or past the proxy's timeout) failed because its engine did: the agent's exit is the
# consequence, not its score. The trainer files it under
# this reason, an infrastructure one (data/infra_policy.py); the ledger keeps the controller's.
ENGINE_FAILED = "ENGINE_FAILED"
ENGINE_FAILURE_STATUSES = frozenset({502, 503, 504})
AGENT_REASONS = frozenset({"EXIT_CODE", "JOB_FAILED", "UNSPECIFIED", ""})


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
    # Of those, the ones the proxy answered 502, 503 or 504: no engine could answer (dead, restarting, held back).
    engine_unavailable_calls: int = 0
    # Every successful call, in order (the triplets are those of them with tokens to train on).
    calls: list[CallOutcome] = field(default_factory=list)
    # The reward that counts (the last one) was posted before the rollout's last model call.
    reward_before_last_call: bool = False
    # Why a failed rollout failed: the FailureReason name without its prefix ("KILLED", "EXIT_CODE"), "" if none,
    # and the ledger's error message (the controller's: exit code or signal, the agent's log path, its last line).
    failure_reason: str = ""
    error_message: str = ""
    # Attempts the rollout had (retries of infrastructure failures add some); 1 when the ledger kept none.
    attempts: int = 1
    # The final attempt (the one whose events these are); events the trainer appends are filed under it.
    attempt_id: str = ""
    # Its calls as text, when read from the full events (validation rollouts with a trajectory log); else None.
    call_texts: list[CallText] | None = None


@dataclass
class _Scan:
    triplets: list[Triplet] = field(default_factory=list)
    reward: float | None = None
    calls: list[CallOutcome] = field(default_factory=list)
    failed_calls: int = 0
    engine_unavailable_calls: int = 0
    # Positions (in the event sequence) of the last call, successful or not, and of the last reward.
    last_call_at: int = -1
    reward_at: int = -1
    # The HTTP status the proxy answered the last call with (0: no call).
    last_call_status: int = 0


def _scan(events: Iterable[event_pb2.Event], counts: Counter[str]) -> _Scan:
    """One pass over a rollout's events: triplets, the last reward, every successful call's outcome, failures."""
    scan = _Scan()
    for position, event in enumerate(events):
        kind = event.WhichOneof("payload")
        if kind == "model_request" or (kind is None and event.event_type == MODEL_REQUEST):
            call = event.model_request
            if call.role in _OTHER_ROLES:  # another policy's or a frozen role's: neither trained nor in its health
                counts[OTHER_ROLE_CALLS] += 1
                continue
            scan.last_call_at = position
            scan.last_call_status = call.http_status or 200
            if call.status not in (event_pb2.MODEL_REQUEST_STATUS_OK, event_pb2.MODEL_REQUEST_STATUS_UNSPECIFIED):
                counts[DROPPED_ERROR_CALLS] += 1
                scan.failed_calls += 1
                scan.engine_unavailable_calls += scan.last_call_status in ENGINE_FAILURE_STATUSES
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
            scan.reward_at = position
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
    failure_reason: str = "",
    error_message: str = "",
    attempts: int = 1,
    attempt_id: str = "",
) -> RolloutTrace:
    """Builds a RolloutTrace; a missing reward becomes reward_fillna_value and is counted."""
    scan = _scan(events, counts)
    if not succeeded and failure_reason in AGENT_REASONS and scan.last_call_status in ENGINE_FAILURE_STATUSES:
        failure_reason = ENGINE_FAILED
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
        engine_unavailable_calls=scan.engine_unavailable_calls,
        calls=scan.calls,
        reward_before_last_call=not missing and scan.reward_at < scan.last_call_at,
        failure_reason=failure_reason,
        error_message=error_message,
        attempts=attempts,
        attempt_id=attempt_id,
    )
