"""The pause state every proxy replica follows, and the replicas' heartbeats (in-flight counts, with a TTL)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from services._gen.agl.v1 import proxy_control_pb2

from .changes import Changes
from .errors import InvalidArgument

DEFAULT_RETRY_AFTER_SECONDS = 5
DEFAULT_TTL_SECONDS = 15.0


@dataclass(slots=True)
class _Replica:
    report: proxy_control_pb2.ProxyReplica
    expires: float  # monotonic seconds


class ProxyControlState:
    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self.control = proxy_control_pb2.ProxyControl(retry_after_seconds=DEFAULT_RETRY_AFTER_SECONDS)
        self._replicas: dict[str, _Replica] = {}
        self.changes = Changes()

    def restore(self, control: proxy_control_pb2.ProxyControl) -> None:
        self.control = control
        del self.control.replicas[:]

    def set_pause(self, paused: bool, retry_after_seconds: int, reason: str, now_ns: int) -> None:
        if retry_after_seconds < 0:
            raise InvalidArgument("retry_after_seconds must not be negative")
        control = proxy_control_pb2.ProxyControl(
            paused=paused,
            retry_after_seconds=retry_after_seconds or DEFAULT_RETRY_AFTER_SECONDS,
            reason=reason,
            generation=self.control.generation + 1,
        )
        control.update_time.FromNanoseconds(now_ns)
        self.control = control
        self.changes.bump()

    def report(
        self, replica_id: str, in_flight: int, observed_generation: int, ttl_seconds: float, leaving: bool, now_ns: int
    ) -> None:
        if not replica_id:
            raise InvalidArgument("replica_id is required")
        if in_flight < 0 or ttl_seconds < 0:
            raise InvalidArgument("in_flight and ttl_seconds must not be negative")
        if leaving:
            if self._replicas.pop(replica_id, None) is not None:
                self.changes.bump()
            return
        ttl = ttl_seconds or DEFAULT_TTL_SECONDS
        report = proxy_control_pb2.ProxyReplica(
            replica_id=replica_id, in_flight=in_flight, observed_generation=observed_generation, ttl_seconds=ttl
        )
        report.report_time.FromNanoseconds(now_ns)
        previous = self._replicas.get(replica_id)
        self._replicas[replica_id] = _Replica(report, self._monotonic() + ttl)
        if previous is None or (previous.report.in_flight, previous.report.observed_generation) != (
            in_flight,
            observed_generation,
        ):
            self.changes.bump()

    def expire(self) -> float | None:
        """Forget replicas whose TTL passed; return seconds until the next expiry (None when no replica)."""
        now = self._monotonic()
        gone = [rid for rid, r in self._replicas.items() if r.expires <= now]
        for rid in gone:
            del self._replicas[rid]
        if gone:
            self.changes.bump()
        if not self._replicas:
            return None
        return max(0.0, min(r.expires for r in self._replicas.values()) - now)

    def snapshot(self) -> proxy_control_pb2.ProxyControl:
        self.expire()
        out = proxy_control_pb2.ProxyControl()
        out.CopyFrom(self.control)
        out.replicas.extend(self._replicas[rid].report for rid in sorted(self._replicas))
        return out

    def persisted(self) -> bytes:
        """The durable part (pause state, generation), without replicas."""
        return self.control.SerializeToString()
