"""A reward the agent returned instead of posting (the older Agent Lightning habit: run() returns a float).

When an agent class's run() returned a number and the attempt has no reward event, the controller appends one
(value x, source "returned", the attempt's id) before it reports the attempt succeeded, so the trainer's
terminal feed sees it with the rollout. A reward the agent posted wins: the returned value is then ignored.
The local runner reads the value from agent_runner's result file; the Kubernetes runner from the pod's
termination message (job_status.returned_in_pods).
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

from services._gen.agl.v1 import event_pb2
from services.client import LedgerClient, LedgerError

from .outcome import parse_returned

log = logging.getLogger(__name__)

SOURCE = "returned"


def take_returned(path: Path | None) -> float | None:
    """The number the agent's run() returned (agent_runner wrote it there), removing the file; None if there is none."""
    if path is None:
        return None
    try:
        text = path.read_text()
    except OSError:
        return None
    with contextlib.suppress(OSError):
        path.unlink()
    return parse_returned(text)


async def post_returned_reward(ledger: LedgerClient, rollout_id: str, attempt_id: str, value: float) -> bool:
    """Appends the returned reward unless the attempt has one; True when it was appended."""
    try:
        posted = await ledger.list_events(rollout_id, attempt_id=attempt_id, event_type="reward")
        if posted:
            log.debug(
                "rollout %s: run() returned %g, but the agent posted a reward; the returned value is ignored",
                rollout_id,
                value,
            )
            return False
        reward = event_pb2.Reward(value=value, source=SOURCE)
        event = event_pb2.Event(rollout_id=rollout_id, attempt_id=attempt_id, event_type="reward", reward=reward)
        await ledger.append_events([event])
    except LedgerError as err:
        log.warning(
            "rollout %s: could not post the reward %g run() returned (%s: %s); the attempt has no reward",
            rollout_id, value, err.code_name, err.details(),
        )  # fmt: skip
        return False
    log.info("rollout %s: posted the reward %g run() returned (attempt %s)", rollout_id, value, attempt_id)
    return True
