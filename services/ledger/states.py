"""The rollout state machine as an explicit transition table."""

from __future__ import annotations

from services._gen.agl.v1 import rollout_pb2

from .errors import FailedPrecondition, InvalidArgument

QUEUING = rollout_pb2.ROLLOUT_STATE_QUEUING
RUNNING = rollout_pb2.ROLLOUT_STATE_RUNNING
SUCCEEDED = rollout_pb2.ROLLOUT_STATE_SUCCEEDED
FAILED = rollout_pb2.ROLLOUT_STATE_FAILED

# state -> states it may move to. Terminal states map to nothing: they are final.
TRANSITIONS: dict[int, frozenset[int]] = {
    QUEUING: frozenset({RUNNING, FAILED}),
    # running -> running updates the launcher handle, attempt or error text without changing state.
    RUNNING: frozenset({RUNNING, SUCCEEDED, FAILED}),
    SUCCEEDED: frozenset(),
    FAILED: frozenset(),
}

TERMINAL: frozenset[int] = frozenset({SUCCEEDED, FAILED})

# running -> queuing is not in the table: no caller may ask for it. The ledger makes that move itself when a running
# attempt is reported FAILED for a reason the rollout's RetryPolicy retries and attempts remain (see attempts.py).
RETRY_MOVE: tuple[int, int] = (RUNNING, QUEUING)


def state_name(state: int) -> str:
    """`ROLLOUT_STATE_RUNNING` -> `running`; unknown numbers are shown as numbers."""
    try:
        return rollout_pb2.RolloutState.Name(state).removeprefix("ROLLOUT_STATE_").lower()
    except ValueError:
        return str(state)


def is_terminal(state: int) -> bool:
    return state in TERMINAL


def check_transition(rollout_id: str, current: int, target: int) -> None:
    """Raise unless `current -> target` is in the table."""
    if target not in TRANSITIONS:
        raise InvalidArgument(f"rollout {rollout_id}: target state {state_name(target)} is not a valid state")
    if target not in TRANSITIONS[current]:
        raise FailedPrecondition(
            f"rollout {rollout_id}: illegal transition {state_name(current)} -> {state_name(target)}"
        )
