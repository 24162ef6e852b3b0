"""Controller liveness: a lease per controller, renewed by its heartbeats, and who owns which RUNNING rollouts.

A controller whose lease expired while it still owns RUNNING rollouts is reported to every live controller that
heartbeats, so one of them takes its rollouts over (the takeover itself is a compare-and-set claim, which exactly
one controller wins). Leases are kept in memory only: a ledger that restarts gives every owner of RUNNING rollouts
a fresh lease, noticed at the first heartbeat of any controller, that lasts at least the longest TTL seen (and the
default), so a live controller always renews before anyone may take its rollouts. The same holds for an owner the
ledger never heard a heartbeat from (a controller that predates leases): it is noticed and given that grace first.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass

from services._gen.agl.v1 import controller_lease_pb2

from .errors import InvalidArgument
from .validation import check_safe_id

DEFAULT_TTL_SECONDS = 30.0
MAX_TTL_SECONDS = 3600.0


@dataclass(slots=True)
class _Lease:
    ttl_s: float
    renew_ns: int  # wall clock of the last heartbeat; 0 for a lease assumed when the owner was noticed
    expires: float  # monotonic seconds
    expire_ns: int  # the same moment on the wall clock, for readers


class ControllerLeases:
    def __init__(
        self, monotonic: Callable[[], float] = time.monotonic, wall_ns: Callable[[], int] = time.time_ns
    ) -> None:
        self._monotonic = monotonic
        self._wall_ns = wall_ns
        self._leases: dict[str, _Lease] = {}
        # controller id -> RUNNING rollouts whose status names it (kept by the ledger on every status change)
        self.running: collections.Counter[str] = collections.Counter()
        self._longest_ttl = DEFAULT_TTL_SECONDS

    def moved(self, before: str, was_running: bool, after: str, is_running: bool) -> None:
        """A rollout's owner or state changed (created, updated, deleted): keep the RUNNING counts."""
        if was_running and before:
            self.running[before] -= 1
            if self.running[before] <= 0:
                del self.running[before]
        if is_running and after:
            self.running[after] += 1

    def renew(self, controller_id: str, ttl_seconds: float, leaving: bool) -> controller_lease_pb2.ControllerLease:
        if not controller_id:
            raise InvalidArgument("controller_id is required")
        check_safe_id(controller_id, "controller_id", "RenewControllerLease")
        if not 0 <= ttl_seconds <= MAX_TTL_SECONDS:  # also refuses NaN
            raise InvalidArgument(f"ttl_seconds must be between 0 and {MAX_TTL_SECONDS:g}, not {ttl_seconds!r}")
        ttl = ttl_seconds or DEFAULT_TTL_SECONDS
        self._longest_ttl = max(self._longest_ttl, ttl)
        now, now_ns = self._monotonic(), self._wall_ns()
        lease = _Lease(ttl, now_ns, now, now_ns) if leaving else _Lease(ttl, now_ns, now + ttl, now_ns + int(ttl * 1e9))
        self._leases[controller_id] = lease
        return self._message(controller_id, lease)

    def expired(self, exclude: str) -> list[controller_lease_pb2.ControllerLease]:
        """Leases (other than `exclude`'s) that have ended while their controller still owns RUNNING rollouts,
        earliest expiry first. Owners without a lease get one now (see the module docstring); ended leases of
        controllers that own nothing are forgotten."""
        now, now_ns = self._monotonic(), self._wall_ns()
        for owner in self.running:
            if owner not in self._leases:
                grace = self._longest_ttl
                self._leases[owner] = _Lease(grace, 0, now + grace, now_ns + int(grace * 1e9))
        out: list[tuple[float, str, _Lease]] = []
        for controller_id, lease in list(self._leases.items()):
            if lease.expires > now:
                continue
            if not self.running.get(controller_id):
                del self._leases[controller_id]
            elif controller_id != exclude:
                out.append((lease.expires, controller_id, lease))
        out.sort(key=lambda item: (item[0], item[1]))
        return [self._message(controller_id, lease) for _, controller_id, lease in out]

    def _message(self, controller_id: str, lease: _Lease) -> controller_lease_pb2.ControllerLease:
        message = controller_lease_pb2.ControllerLease(
            controller_id=controller_id, ttl_seconds=lease.ttl_s, running_rollouts=self.running.get(controller_id, 0)
        )
        if lease.renew_ns:
            message.renew_time.FromNanoseconds(lease.renew_ns)
        message.expire_time.FromNanoseconds(lease.expire_ns)
        return message
