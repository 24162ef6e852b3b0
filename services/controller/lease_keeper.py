"""The controller's lease in the ledger: a heartbeat every third of the TTL, and the dead controllers it learns of.

Each heartbeat (RenewControllerLease) renews this controller's lease and returns the leases of other controllers
that expired while they still own RUNNING rollouts; those are handed to the controller, which takes the rollouts
over (a compare-and-set claim each, so exactly one live controller does). A ledger that does not know the RPC
turns the takeover off with one warning; an unreachable ledger is tried again at the next beat, and the lease
holds as long as one beat in three gets through.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import grpc

from services._gen.agl.v1 import controller_lease_pb2
from services.client import LedgerClient, LedgerError

log = logging.getLogger(__name__)

Lease = controller_lease_pb2.ControllerLease


def stopped_heartbeating(lease: Lease) -> str:
    """The reason given for the rollouts of a controller whose lease expired."""
    if lease.HasField("renew_time") and lease.renew_time.seconds:
        when = lease.renew_time.ToDatetime().strftime("%Y-%m-%d %H:%M:%S UTC")
        return f"controller {lease.controller_id} stopped heartbeating at {when}"
    ended = lease.expire_time.ToDatetime().strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"controller {lease.controller_id} sent no heartbeat to this ledger (lease assumed until {ended})"


class LeaseKeeper:
    def __init__(
        self,
        ledger: LedgerClient,
        controller_id: str,
        ttl_s: float,
        on_expired: Callable[[list[Lease]], None],
    ) -> None:
        self._ledger = ledger
        self._id = controller_id
        self.ttl_s = ttl_s
        self._on_expired = on_expired
        self._failing = False
        self.beats = 0  # heartbeats the ledger acknowledged

    async def run(self) -> None:
        """Heartbeats until cancelled."""
        interval = self.ttl_s / 3
        while True:
            if not await self.beat():
                return
            await asyncio.sleep(interval)

    async def beat(self) -> bool:
        """One heartbeat; False when the ledger has no leases (takeover off)."""
        try:
            reply = await self._ledger.renew_controller_lease(self._id, self.ttl_s, timeout_s=self.ttl_s / 3)
        except LedgerError as err:
            if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                log.warning("the ledger keeps no controller leases: dead controllers' rollouts are not taken over")
                return False
            if not self._failing:
                log.warning("controller lease not renewed (%s: %s); trying again", err.code().name, err.details())
            self._failing = True
            return True
        if self._failing:
            log.info("controller lease renewed again")
        self._failing = False
        self.beats += 1
        if reply.expired_leases:
            self._on_expired(list(reply.expired_leases))
        return True

    async def leave(self) -> None:
        """Ends the lease at shutdown (best effort), so live controllers take over what is left without waiting."""
        with contextlib.suppress(LedgerError, asyncio.TimeoutError):
            await self._ledger.renew_controller_lease(self._id, self.ttl_s, leaving=True, timeout_s=2.0)
