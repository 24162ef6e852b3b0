"""gRPC health (grpc.health.v1) that follows the store: SERVING only while writes can be made durable.

NOT_SERVING, for the whole server ("") and for agl.v1.LedgerService alike:
- from the moment the store fails (a commit refused, e.g. a full disk), before any caller hears that its write
  failed; the ledger then shuts down, and a restart once the cause is fixed reloads the file;
- while the write being committed has waited longer than `stall_s` (the SQLite file locked by another process,
  for however long: the store tries the write again until the lock is released; a disk that does not answer);
  SERVING again as soon as it commits.
The check is a look at two numbers the store keeps, every `interval_s`. Liveness is the service name "liveness": SERVING
for as long as the server answers, whatever the store does (a slow disk is a reason to stop routing, not to restart).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from grpc_health.v1 import health, health_pb2

from .store import Store

log = logging.getLogger(__name__)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
LIVENESS = "liveness"


class StoreHealth:
    def __init__(
        self,
        servicer: health.aio.HealthServicer,
        store: Store,
        services: Sequence[str],
        *,
        stall_s: float,
        interval_s: float = 0.25,
    ) -> None:
        self._servicer = servicer
        self._store = store
        self._services = ("", *services)
        self._stall_s = stall_s
        self._interval_s = interval_s
        self._status: int | None = None
        self._task: asyncio.Task[None] | None = None
        self._failing: asyncio.Task[None] | None = None

    def status(self) -> tuple[int, str]:
        """(status, reason) as the store stands now."""
        if (failure := self._store.failure) is not None:
            return NOT_SERVING, f"the store failed: {failure}"
        waited = self._store.commit_waiting_s()
        if waited > self._stall_s:
            return NOT_SERVING, f"a write has waited {waited:.1f}s for the store to commit it"
        return SERVING, ""

    async def start(self) -> None:
        await self._servicer.set(LIVENESS, SERVING)
        await self.update()
        self._task = asyncio.create_task(self._follow(), name="ledger-health")

    def store_failed(self) -> None:
        """Called by the store the moment it fails (in the event loop's thread)."""
        self._failing = asyncio.ensure_future(self.update())

    async def update(self) -> None:
        status, reason = self.status()
        if status == self._status:
            return
        if status == SERVING and self._status is not None:
            log.info("health: SERVING again (the store commits)")
        elif status == NOT_SERVING:
            log.warning("health: NOT_SERVING: %s", reason)
        self._status = status
        for service in self._services:
            await self._servicer.set(service, status)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _follow(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            await self.update()
