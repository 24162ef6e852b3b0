"""Pause, resume and drain across every proxy replica, coordinated through the ledger.

The ledger holds one ProxyControl (paused, retry-after, reason, generation) and each replica's last report
(in-flight calls, the generation it had applied). A replica follows WatchProxyControl, counts its calls, and
reports on a heartbeat and at once when it applies a new generation or runs out of calls while paused.

Correctness of drain: a call counts itself in flight *before* it looks at the pause flag, and a replica applies a
generation before it reports that generation. So once every live replica has reported the paused generation with
zero calls in flight, no call is running and none can start. A replica that dies stops reporting and drops out of
the live set after its TTL.

A pause may name one model (the ledger's model_pauses): it refuses only the calls routed to that model, and a drain
of that model waits only for them. A call counts itself twice: in the replica's total as it arrives (before the
proxy-wide flag is read), and in its model's count once its rollout says which model (before that model's flag is
read), so the same argument holds per model.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from services._gen.agl.v1 import proxy_control_pb2
from services.client import LedgerClient, LedgerError, Refused, backoff_s
from services.proxy.background import stop_tasks
from services.proxy.errors import ProxyError, from_ledger
from services.proxy.fleet.readiness import Readiness
from services.proxy.metrics import ProxyMetrics

log = logging.getLogger(__name__)
_DRAIN_POLL_S = 0.05


def report_timeout_s(heartbeat_s: float) -> float:
    """The deadline of one heartbeat report: /readyz turns 503 at most a heartbeat plus this after the ledger's
    last answer (1.5 heartbeats, at least 1 s: 3 s with the default 2 s heartbeat)."""
    return max(1.0, 1.5 * heartbeat_s)


class Coordinator:
    def __init__(
        self,
        client: LedgerClient,
        replica_id: str,
        heartbeat_s: float,
        ttl_s: float,
        metrics: ProxyMetrics,
        readiness: Readiness | None = None,
    ) -> None:
        self.client = client
        self.readiness = readiness or Readiness(client.address)
        self.replica_id = replica_id
        self.heartbeat_s = heartbeat_s
        # A report is a small call: one the ledger has not answered in this long means a ledger that hangs (stopped,
        # swapping, its loop blocked), and /readyz says so then, not after the client's whole call timeout.
        self.report_timeout_s = report_timeout_s(heartbeat_s)
        self.ttl_s = ttl_s
        self.metrics = metrics
        self.in_flight = 0
        metrics.in_flight.set_function(lambda: self.in_flight)  # read at scrape time, not set twice per call
        self.paused = False
        self.retry_after = 5
        self.reason = ""
        self.generation = 0
        self.model_in_flight: dict[str, int] = {}
        self.model_pauses: dict[str, proxy_control_pb2.ModelPause] = {}
        self.synced = asyncio.Event()
        self._report_now = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._report_failures = 0

    # -- calls ------------------------------------------------------------------------------------------------

    def enter(self) -> None:
        """Counts a model call in, or refuses it with 429 while paused."""
        self.in_flight += 1
        if self.paused:
            self.in_flight -= 1
            message = "The proxy is paused" + (f" ({self.reason})" if self.reason else "") + "; retry later."
            raise ProxyError("paused", message, headers={"Retry-After": str(self.retry_after)})

    def enter_model(self, model: str) -> None:
        """Counts an entered call in for the model it is routed to, or refuses it with 429 while that model is
        paused (the caller leaves with the model only once this returned)."""
        self.model_in_flight[model] = self.model_in_flight.get(model, 0) + 1
        pause = self.model_pauses.get(model)
        if pause is not None:
            self._leave_model(model)
            message = f"Model {model} is paused" + (f" ({pause.reason})" if pause.reason else "") + "; retry later."
            raise ProxyError("paused", message, headers={"Retry-After": str(pause.retry_after_seconds or 5)})

    def leave(self, model: str | None = None) -> None:
        """Counts a call out (of its model's count too, when it was counted in there)."""
        self.in_flight -= 1
        if model is not None:
            self._leave_model(model)
        if self.paused and self.in_flight == 0:
            self._report_now.set()

    def _leave_model(self, model: str) -> None:
        left = self.model_in_flight[model] - 1
        if left:
            self.model_in_flight[model] = left
            return
        del self.model_in_flight[model]
        if model in self.model_pauses:
            self._report_now.set()

    def paused_for(self, model: str) -> bool:
        """Whether calls routed to `model` are refused now (every call, or that model's)."""
        return self.paused or model in self.model_pauses

    def _is_paused(self, model: str) -> bool:
        return model in self.model_pauses if model else self.paused

    def apply(self, control: proxy_control_pb2.ProxyControl) -> None:
        if control.generation < self.generation:
            return
        if control.generation != self.generation:
            models = ", ".join(
                f"{p.model_name} ({p.reason})" if p.reason else p.model_name for p in control.model_pauses
            )
            log.info(
                "proxy control generation %d: %s%s%s",
                control.generation,
                "paused" if control.paused else "running",
                f" ({control.reason})" if control.reason else "",
                f"; models paused: {models}" if models else "",
            )
            self._report_now.set()
        self.model_pauses = {p.model_name: p for p in control.model_pauses}
        self.paused = control.paused
        self.retry_after = control.retry_after_seconds or 5
        self.reason = control.reason
        self.generation = control.generation
        self.metrics.paused.set(1 if self.paused else 0)
        self.synced.set()

    # -- background -------------------------------------------------------------------------------------------

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._watch()), asyncio.create_task(self._heartbeat())]

    async def stop(self) -> None:
        await stop_tasks(self._tasks)
        with contextlib.suppress(LedgerError):
            await self.client.report_proxy_replica(self.replica_id, 0, self.generation, self.ttl_s, leaving=True)

    async def _watch(self) -> None:
        failures = 0
        while True:
            try:
                async for control in self.client.watch_proxy_control():
                    failures = 0
                    self.readiness.succeeded()
                    self.apply(control)
            except LedgerError as err:
                # Logged by the readiness tracker once per change of state (a refused key is one clear line).
                failures += 1
                self.readiness.failed(err)
                log.debug("proxy control watch failed (%s); retrying", err.code_name)
                await asyncio.sleep(backoff_s(failures))

    async def _heartbeat(self) -> None:
        while True:
            try:
                control = await self.client.report_proxy_replica(
                    self.replica_id,
                    self.in_flight,
                    self.generation,
                    self.ttl_s,
                    timeout_s=self.report_timeout_s,
                    model_in_flight=dict(self.model_in_flight),
                )
                self.readiness.succeeded()
                self.apply(control)
                if self._report_failures:
                    log.info("replica %s reporting again", self.replica_id)
                self._report_failures = 0
            except LedgerError as err:
                self._report_failures += 1
                self.readiness.failed(err)
                if not isinstance(err, Refused) and (
                    self._report_failures in (1, 10) or self._report_failures % 100 == 0
                ):
                    log.warning("replica report failed %d time(s): %s", self._report_failures, err.code_name)
            wait_s = self.heartbeat_s
            if self._report_failures and self.readiness.state != "ok":
                # Backs off while the ledger is away or refuses the key; a heartbeat is still cheap, so the cap is low.
                wait_s = max(self.heartbeat_s, min(backoff_s(self._report_failures, self.heartbeat_s), 10.0))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._report_now.wait(), wait_s)
            self._report_now.clear()

    # -- management -------------------------------------------------------------------------------------------

    async def _ledger(self, what: str, call: Any) -> proxy_control_pb2.ProxyControl:
        try:
            return await call
        except LedgerError as err:
            raise from_ledger(err, what) from None

    async def pause(
        self, retry_after_s: int, reason: str, owner: str = "", lease_s: float = 0.0, model: str = ""
    ) -> dict[str, Any]:
        """Pause every replica (every call, or only `model`'s); an owner with a lease renews its own pause and is
        lifted when it stops renewing."""
        call = self.client.set_proxy_pause(
            True, retry_after_s, reason, owner=owner, lease_seconds=lease_s, model_name=model
        )
        control = await self._ledger("SetProxyPause", call)
        self.apply(control)
        return self.describe(control)

    async def resume(self, model: str = "") -> dict[str, Any]:
        call = self.client.set_proxy_pause(False, self.retry_after, "", model_name=model)
        control = await self._ledger("SetProxyPause", call)
        self.apply(control)
        return self.describe(control)

    async def state(self) -> dict[str, Any]:
        return self.describe(await self._ledger("GetProxyControl", self.client.get_proxy_control()))

    async def drain(
        self, timeout_s: float, retry_after_s: int, reason: str, owner: str = "", lease_s: float = 0.0, model: str = ""
    ) -> dict[str, Any]:
        """Pauses (if not paused yet, or as `owner`) and waits until no replica has a call in flight (routed to
        `model`, when named), or the timeout."""
        started = time.monotonic()
        if not self._is_paused(model) or owner:
            await self.pause(retry_after_s, reason or "draining", owner, lease_s, model)
        while True:
            control = await self._ledger("GetProxyControl", self.client.get_proxy_control())
            busy = [
                r
                for r in control.replicas
                if r.observed_generation < control.generation
                or (r.model_in_flight.get(model, 0) if model else r.in_flight) > 0
            ]
            paused = any(p.model_name == model for p in control.model_pauses) if model else control.paused
            waited = time.monotonic() - started
            if not paused or not busy or waited >= timeout_s:
                drained = paused and not busy
                result = self.describe(control)
                result.update(drained=drained, waited_seconds=round(waited, 3))
                log.info("drain %s after %.3fs", "complete" if drained else "incomplete", waited)
                return result
            await asyncio.sleep(min(_DRAIN_POLL_S, max(timeout_s - waited, 0.001)))

    @staticmethod
    def describe(control: proxy_control_pb2.ProxyControl) -> dict[str, Any]:
        replicas = [
            {
                "replica_id": r.replica_id,
                "in_flight": r.in_flight,
                "observed_generation": r.observed_generation,
                "model_in_flight": dict(r.model_in_flight),
            }
            for r in control.replicas
        ]
        model_pauses = [
            {"model": p.model_name, "reason": p.reason, "owner": p.owner, "retry_after_seconds": p.retry_after_seconds}
            for p in control.model_pauses
        ]
        return {
            "paused": control.paused,
            "retry_after_seconds": control.retry_after_seconds,
            "reason": control.reason,
            "generation": control.generation,
            "in_flight": sum(r["in_flight"] for r in replicas),
            "replicas": replicas,
            "model_pauses": model_pauses,
        }
