"""The pause state every proxy replica follows, and the replicas' heartbeats (in-flight counts, with a TTL).

A pause may name its owner and carry a lease: the owner renews it by pausing again (the generation stays, so a drain
in progress is not disturbed), and a lease that runs out lifts the pause (a new generation, the reason saying why),
so a trainer that died mid-update never leaves every later agent call answered 429.

A pause may also name one model (`model_pauses`): it holds only the calls routed to that model, so one training run
pausing around its own weight update leaves the other runs' calls going. Each model's pause has its own owner and
lease, kept and lifted the same way; every change to any pause bumps the one generation the replicas acknowledge.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from services._gen.agl.v1 import proxy_control_pb2

from .changes import Changes
from .errors import InvalidArgument

DEFAULT_RETRY_AFTER_SECONDS = 5
DEFAULT_TTL_SECONDS = 15.0
MAX_LEASE_SECONDS = 86400.0


@dataclass(slots=True)
class _Replica:
    report: proxy_control_pb2.ProxyReplica
    expires: float  # monotonic seconds


class ProxyControlState:
    def __init__(
        self,
        monotonic: Callable[[], float] = time.monotonic,
        wall_ns: Callable[[], int] = time.time_ns,
        on_lifted: Callable[[str], None] | None = None,
    ) -> None:
        self._monotonic = monotonic
        self._wall_ns = wall_ns  # leases are wall-clock times: they are stored, and outlive a restart
        self.control = proxy_control_pb2.ProxyControl(retry_after_seconds=DEFAULT_RETRY_AFTER_SECONDS)
        self._replicas: dict[str, _Replica] = {}
        self.changes = Changes()
        # Told (with the lifted pause's reason) after a lease ran out and the pause was lifted: the ledger stores it.
        self.on_lifted = on_lifted

    def restore(self, control: proxy_control_pb2.ProxyControl) -> None:
        self.control = control
        del self.control.replicas[:]

    def set_pause(
        self,
        paused: bool,
        retry_after_seconds: int,
        reason: str,
        now_ns: int,
        owner: str = "",
        lease_s: float = 0.0,
        model_name: str = "",
    ) -> bool:
        """Pause or resume (every call, or only `model_name`'s); True when it is the owner renewing the pause it holds
        (no new generation)."""
        if retry_after_seconds < 0:
            raise InvalidArgument("retry_after_seconds must not be negative")
        if not 0.0 <= lease_s <= MAX_LEASE_SECONDS:  # NaN fails both comparisons
            raise InvalidArgument(f"lease_seconds must be between 0 and {MAX_LEASE_SECONDS:g}, got {lease_s!r}")
        if lease_s and not owner:
            raise InvalidArgument("a pause with lease_seconds needs an owner (who renews it)")
        if not paused and (owner or lease_s):
            raise InvalidArgument("owner and lease_seconds go with a pause, not a resume")
        if model_name:
            return self._set_model_pause(paused, retry_after_seconds, reason, now_ns, owner, lease_s, model_name)
        renewal = paused and bool(owner) and self.control.paused and self.control.owner == owner
        control = proxy_control_pb2.ProxyControl(
            paused=paused,
            retry_after_seconds=retry_after_seconds or DEFAULT_RETRY_AFTER_SECONDS,
            reason=reason,
            generation=self.control.generation + (0 if renewal else 1),
            owner=owner if paused else "",
            model_pauses=self.control.model_pauses,
        )
        control.update_time.FromNanoseconds(now_ns)
        if paused and lease_s:
            control.lease_expire_time.FromNanoseconds(now_ns + int(lease_s * 1e9))
        self.control = control
        self.changes.bump()
        return renewal

    def _set_model_pause(
        self, paused: bool, retry_after_seconds: int, reason: str, now_ns: int, owner: str, lease_s: float, model: str
    ) -> bool:
        pauses = {p.model_name: p for p in self.control.model_pauses}
        held = pauses.pop(model, None)
        renewal = paused and bool(owner) and held is not None and held.owner == owner
        if paused:
            pause = proxy_control_pb2.ModelPause(
                model_name=model,
                retry_after_seconds=retry_after_seconds or DEFAULT_RETRY_AFTER_SECONDS,
                reason=reason,
                owner=owner,
            )
            pause.update_time.FromNanoseconds(now_ns)
            if lease_s:
                pause.lease_expire_time.FromNanoseconds(now_ns + int(lease_s * 1e9))
            pauses[model] = pause
        self._replace_model_pauses(pauses.values(), bump=not renewal)
        return renewal

    def _replace_model_pauses(self, pauses: Iterable[proxy_control_pb2.ModelPause], bump: bool) -> None:
        kept = []
        for pause in sorted(pauses, key=lambda p: p.model_name):  # copied out before the field is cleared
            kept.append(proxy_control_pb2.ModelPause())
            kept[-1].CopyFrom(pause)
        del self.control.model_pauses[:]
        self.control.model_pauses.extend(kept)
        if bump:
            self.control.generation += 1
        self.changes.bump()

    def lease_left_s(self) -> float | None:
        """Seconds until the pause's lease runs out (0 once it has), None without a leased pause."""
        if not (self.control.paused and self.control.HasField("lease_expire_time")):
            return None
        return max(0.0, (self.control.lease_expire_time.ToNanoseconds() - self._wall_ns()) / 1e9)

    def _lift_expired(self) -> None:
        self._lift_expired_models()
        if self.lease_left_s() != 0.0:
            return
        held = self.control
        lifted = (
            f"lifted by the ledger: {held.owner} did not renew its pause by "
            f"{held.lease_expire_time.ToJsonString()} (it paused for: {held.reason or 'no reason given'})"
        )
        control = proxy_control_pb2.ProxyControl(
            paused=False,
            retry_after_seconds=held.retry_after_seconds,
            reason=lifted,
            generation=held.generation + 1,
            model_pauses=held.model_pauses,
        )
        control.update_time.FromNanoseconds(self._wall_ns())
        self.control = control
        self.changes.bump()
        if self.on_lifted is not None:
            self.on_lifted(lifted)

    def _model_leases_left_s(self) -> dict[str, float]:
        now = self._wall_ns()
        return {
            p.model_name: max(0.0, (p.lease_expire_time.ToNanoseconds() - now) / 1e9)
            for p in self.control.model_pauses
            if p.HasField("lease_expire_time")
        }

    def _lift_expired_models(self) -> None:
        expired = {name for name, left in self._model_leases_left_s().items() if left == 0.0}
        if not expired:
            return
        lifted = [
            f"pause of model {p.model_name} lifted by the ledger: {p.owner} did not renew it by "
            f"{p.lease_expire_time.ToJsonString()} (it paused for: {p.reason or 'no reason given'})"
            for p in self.control.model_pauses
            if p.model_name in expired
        ]
        self._replace_model_pauses([p for p in self.control.model_pauses if p.model_name not in expired], bump=True)
        for reason in lifted:
            if self.on_lifted is not None:
                self.on_lifted(reason)

    def report(
        self,
        replica_id: str,
        in_flight: int,
        observed_generation: int,
        ttl_seconds: float,
        leaving: bool,
        now_ns: int,
        model_in_flight: Mapping[str, int] | None = None,
    ) -> None:
        if not replica_id:
            raise InvalidArgument("replica_id is required")
        models = {name: count for name, count in (model_in_flight or {}).items() if count}
        if in_flight < 0 or ttl_seconds < 0 or any(count < 0 for count in models.values()):
            raise InvalidArgument("in_flight, model_in_flight and ttl_seconds must not be negative")
        if leaving:
            if self._replicas.pop(replica_id, None) is not None:
                self.changes.bump()
            return
        ttl = ttl_seconds or DEFAULT_TTL_SECONDS
        report = proxy_control_pb2.ProxyReplica(
            replica_id=replica_id,
            in_flight=in_flight,
            observed_generation=observed_generation,
            ttl_seconds=ttl,
            model_in_flight=models,
        )
        report.report_time.FromNanoseconds(now_ns)
        previous = self._replicas.get(replica_id)
        self._replicas[replica_id] = _Replica(report, self._monotonic() + ttl)
        if previous is None or (
            previous.report.in_flight,
            previous.report.observed_generation,
            dict(previous.report.model_in_flight),
        ) != (in_flight, observed_generation, models):
            self.changes.bump()

    def expire(self) -> float | None:
        """Forget replicas whose TTL passed and lift a pause whose lease ran out; return seconds until the next
        expiry of either (None when there is nothing to expire)."""
        self._lift_expired()
        now = self._monotonic()
        gone = [rid for rid, r in self._replicas.items() if r.expires <= now]
        for rid in gone:
            del self._replicas[rid]
        if gone:
            self.changes.bump()
        waits = [r.expires - now for r in self._replicas.values()]
        lease = self.lease_left_s()
        if lease is not None:
            waits.append(lease)
        waits.extend(self._model_leases_left_s().values())
        return max(0.0, min(waits)) if waits else None

    def snapshot(self) -> proxy_control_pb2.ProxyControl:
        self.expire()
        out = proxy_control_pb2.ProxyControl()
        out.CopyFrom(self.control)
        out.replicas.extend(self._replicas[rid].report for rid in sorted(self._replicas))
        return out

    def persisted(self) -> bytes:
        """The durable part (pause state, generation), without replicas."""
        return self.control.SerializeToString()
