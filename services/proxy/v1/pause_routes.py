"""Agent Lightning v1.0's gateway management (`POST /proxy/pause`, `POST /proxy/resume`, `GET /proxy/state`) over
the proxy's coordinator: the same pause, across every replica, as AGL's /admin routes, in v1.0's bodies.

v1.0's trainer pauses, then polls the state until `inflight` is 0, then updates the weights. One v1.0 gateway knew
its own calls; here the pause is the ledger's and `inflight` counts every live replica's calls, and a replica that
has not yet reported the pause counts as one call (it may still start one), so `inflight` 0 means what AGL's drain
means: no call runs on any replica and none can start until the resume.
"""

from __future__ import annotations

from typing import Any

from services.proxy.fleet.coordination import Coordinator
from services.proxy.v1.rest_shapes import ShapeError

# The longest Retry-After a pause may tell agents (a day), as on /admin/pause; the ledger keeps a 32-bit number.
MAX_RETRY_AFTER_S = 86_400
DEFAULT_RETRY_AFTER_S = 5  # v1.0's PauseRequest default


def pause_request(body: Any) -> tuple[int, str]:
    """(retry_after_seconds, reason) of v1.0's PauseRequest body {"retry_after_seconds": int, "reason": str|null};
    ShapeError (422) for one v1.0 refuses, or a wait beyond a day."""
    if not isinstance(body, dict):
        raise ShapeError('The body must be a JSON object: {"retry_after_seconds": 5, "reason": "..."}.')
    retry_after = body.get("retry_after_seconds", DEFAULT_RETRY_AFTER_S)
    if isinstance(retry_after, float) and retry_after.is_integer():
        retry_after = int(retry_after)
    if isinstance(retry_after, bool) or not isinstance(retry_after, int) or not 0 <= retry_after <= MAX_RETRY_AFTER_S:
        raise ShapeError(f"`retry_after_seconds` must be an integer between 0 and {MAX_RETRY_AFTER_S}.")
    reason = body.get("reason")
    if reason is not None and not isinstance(reason, str):
        raise ShapeError("`reason` must be a string or null.")
    return retry_after, reason or ""


def state_answer(
    described: dict[str, Any], local_id: str, local_generation: int, local_in_flight: int
) -> dict[str, Any]:
    """v1.0's PauseStateResponse from the coordinator's description of the ledger's proxy control. The replica
    answering knows its own state first-hand (it may not have reported it yet): its calls count as it counts them,
    as one at least while it has not applied the pause."""
    paused = bool(described["paused"])
    generation = described["generation"]
    inflight = 0
    for replica in described["replicas"]:
        if replica["replica_id"] == local_id:
            continue
        lagging = paused and replica["observed_generation"] < generation
        inflight += max(replica["in_flight"], 1 if lagging else 0)
    lagging = paused and local_generation < generation
    inflight += max(local_in_flight, 1 if lagging else 0)
    return {
        "paused": paused,
        "retry_after_seconds": described["retry_after_seconds"] or DEFAULT_RETRY_AFTER_S,
        "reason": described["reason"] or None,
        "inflight": inflight,
    }


class GatewayControl:
    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator = coordinator

    async def pause(self, body: Any) -> dict[str, Any]:
        retry_after, reason = pause_request(body)
        return self._answer(await self.coordinator.pause(retry_after, reason))

    async def resume(self) -> dict[str, Any]:
        return self._answer(await self.coordinator.resume())

    async def state(self) -> dict[str, Any]:
        return self._answer(await self.coordinator.state())

    def _answer(self, described: dict[str, Any]) -> dict[str, Any]:
        local = self.coordinator
        return state_answer(described, local.replica_id, local.generation, local.in_flight)
