"""Attempts and the retry policy: a rollout runs as one or more attempts, and the ledger alone decides (from the
rollout's RetryPolicy and its recorded attempts, both durable) whether a failed attempt ends the rollout or puts it
back in the queue. Every attempt stays in `status.attempts`, so events of an earlier attempt are still accepted
and readable after a restart, and an attempt id is never used twice within a rollout.
"""

from __future__ import annotations

import math

from services._gen.agl.v1 import rollout_pb2

from .errors import InvalidArgument

R = rollout_pb2
MAX_ATTEMPTS = 100
# The longest wait before a retry (one day): the policy's seconds are refused above it at create, and a computed
# backoff (initial * multiplier^(n-1), which can grow past any clock) is cut to it, so a retry time always exists.
MAX_BACKOFF_SECONDS = 86_400.0
MAX_BACKOFF_MULTIPLIER = 100.0

# What an empty retry_on means: faults of the infrastructure, not of the agent's answer.
DEFAULT_RETRY_ON: frozenset[int] = frozenset(
    {
        R.FAILURE_REASON_LAUNCH_ERROR,
        R.FAILURE_REASON_LOST,
        R.FAILURE_REASON_KILLED,
        R.FAILURE_REASON_LAUNCHER_DIED,
        R.FAILURE_REASON_CONTROLLER_SHUTDOWN,
    }
)
NEVER_RETRIED: frozenset[int] = frozenset({R.FAILURE_REASON_INVALID_CONFIG, R.FAILURE_REASON_UNSPECIFIED})
_KNOWN_REASONS = frozenset(R.FailureReason.values())


def reason_name(reason: int) -> str:
    """`FAILURE_REASON_LOST` -> `lost`."""
    try:
        return R.FailureReason.Name(reason).removeprefix("FAILURE_REASON_").lower()
    except ValueError:
        return str(reason)


def check_reason(reason: int, where: str) -> None:
    if reason not in _KNOWN_REASONS:
        raise InvalidArgument(f"{where}: failure_reason {reason} is not a FailureReason")


def check_policy(policy: rollout_pb2.RetryPolicy, where: str) -> None:
    """Raise InvalidArgument naming the field unless the policy is usable."""
    if not 0 <= policy.max_attempts <= MAX_ATTEMPTS:
        raise InvalidArgument(f"{where}: config.retry.max_attempts must be between 0 and {MAX_ATTEMPTS}")
    bounds = (
        ("initial_backoff_seconds", MAX_BACKOFF_SECONDS, " seconds (one day)"),
        ("max_backoff_seconds", MAX_BACKOFF_SECONDS, " seconds (one day)"),
        ("backoff_multiplier", MAX_BACKOFF_MULTIPLIER, ""),
    )
    for name, most, unit in bounds:
        value = getattr(policy, name)
        if not 0 <= value <= most:  # NaN too
            raise InvalidArgument(f"{where}: config.retry.{name} must be between 0 and {most:g}{unit}, not {value!r}")
    for reason in policy.retry_on:
        check_reason(reason, f"{where}: config.retry.retry_on")
        if reason in NEVER_RETRIED:
            raise InvalidArgument(f"{where}: config.retry.retry_on cannot name {reason_name(reason)}")


def retries(policy: rollout_pb2.RetryPolicy, reason: int, attempts_done: int) -> bool:
    """Whether an attempt that failed for `reason`, after `attempts_done` attempts, gets another attempt."""
    if attempts_done >= max(policy.max_attempts, 1) or reason in NEVER_RETRIED:
        return False
    return reason in (frozenset(policy.retry_on) or DEFAULT_RETRY_ON)


def backoff_seconds(policy: rollout_pb2.RetryPolicy, attempts_done: int) -> float:
    """The wait before attempt `attempts_done + 1`: between 0 and MAX_BACKOFF_SECONDS whatever the policy holds (a
    rollout stored before the bounds were checked included), so failing an attempt never fails on arithmetic."""
    cap = MAX_BACKOFF_SECONDS
    if 0 < policy.max_backoff_seconds < cap:
        cap = policy.max_backoff_seconds
    initial = policy.initial_backoff_seconds
    if not initial > 0:  # 0, negative or NaN: no wait
        return 0.0
    multiplier = policy.backoff_multiplier or 2.0
    try:
        delay = initial * multiplier ** max(attempts_done - 1, 0)
    except OverflowError:
        delay = math.inf
    if math.isnan(delay):
        return cap
    return min(max(delay, 0.0), cap)


def known(status: rollout_pb2.RolloutStatus, attempt_id: str) -> bool:
    """Whether `attempt_id` is one of the rollout's attempts (current or earlier)."""
    return attempt_id == status.attempt_id or any(a.attempt_id == attempt_id for a in status.attempts)


def latest(status: rollout_pb2.RolloutStatus) -> str:
    """The current attempt, or while queued for a retry the last one that ran."""
    if status.attempt_id or not status.attempts:
        return status.attempt_id
    return status.attempts[-1].attempt_id


def start(status: rollout_pb2.RolloutStatus, attempt_id: str, launcher_ref: str, now_ns: int) -> None:
    """Record a new running attempt (the rollout was just claimed, or its running attempt was replaced)."""
    attempt = status.attempts.add(attempt_id=attempt_id, number=len(status.attempts) + 1, state=R.ROLLOUT_STATE_RUNNING)
    attempt.launcher_ref = launcher_ref
    attempt.start_time.FromNanoseconds(now_ns)


def running(status: rollout_pb2.RolloutStatus) -> rollout_pb2.Attempt | None:
    """The record of the running attempt (None for a rollout claimed before attempts were recorded)."""
    if status.attempts and status.attempts[-1].state == R.ROLLOUT_STATE_RUNNING:
        return status.attempts[-1]
    return None


def finish(attempt: rollout_pb2.Attempt, state: int, reason: int, message: str, now_ns: int) -> None:
    attempt.state = state
    attempt.failure_reason = reason
    attempt.error_message = message
    attempt.end_time.FromNanoseconds(now_ns)
