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

from services._gen.agl.v1 import controller_lease_pb2
from services.client import LedgerClient, LedgerError, Unimplemented

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

    async def run(self) -> None:
        """Heartbeats until cancelled."""
        interval = self.ttl_s / 3
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            if not await self.beat():
                return
            await asyncio.sleep(max(0.0, started + interval - loop.time()))

    async def beat(self) -> bool:
        """One heartbeat; False when the ledger has no leases (takeover off)."""
        interval = self.ttl_s / 3
        try:  # bounded as a whole (the client retries UNAVAILABLE), so the beats keep their pace
            renewal = self._ledger.renew_controller_lease(self._id, self.ttl_s, timeout_s=interval)
            reply = await asyncio.wait_for(renewal, interval)
        except Unimplemented:
            log.warning("the ledger keeps no controller leases: dead controllers' rollouts are not taken over")
            return False
        except (LedgerError, asyncio.TimeoutError) as err:
            if not self._failing:
                why = f"{err.code_name}: {err.details()}" if isinstance(err, LedgerError) else "no answer in time"
                log.warning("controller lease not renewed (%s); trying again", why)
            self._failing = True
            return True
        if self._failing:
            log.info("controller lease renewed again")
        self._failing = False
        if reply.expired_leases:
            self._on_expired(list(reply.expired_leases))
        return True

    async def leave(self) -> None:
        """Ends the lease at shutdown (best effort), so live controllers take over what is left without waiting."""
        with contextlib.suppress(LedgerError, asyncio.TimeoutError):
            leaving = self._ledger.renew_controller_lease(self._id, self.ttl_s, leaving=True, timeout_s=2.0)
            await asyncio.wait_for(leaving, 3.0)
