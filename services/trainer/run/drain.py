"""Pause, drain and resume the proxies around a weight update (async mode).

Goes through the ledger's proxy-control state, which every proxy replica follows: SetProxyPause(true)
bumps the control generation; each replica reports the generation it has applied and its in-flight model
calls. The proxies are drained when every live replica has applied the pause and has nothing in flight.

The pause names its owner (the trainer's run) and holds a lease, renewed a third of the way through for as long as
the update runs: a trainer killed mid-update leaves a pause the ledger lifts when the lease runs out, instead of
every later agent call answered 429.

With a model name (agl.async_training.pause_scope=model) the pause holds only the calls routed to the run's model,
and the drain waits only for those: several runs training on one proxy and one engine then pause around their own
updates without holding each other's rollouts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from services._gen.agl.v1 import proxy_control_pb2
from services.client import LedgerClient

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DrainResult:
    drained: bool
    seconds: float
    replicas: int


def is_drained(control: proxy_control_pb2.ProxyControl, generation: int, model_name: str = "") -> bool:
    """Every live replica applied `generation` and has no call in flight (routed to `model_name`, when named)."""
    return all(
        r.observed_generation >= generation
        and (r.model_in_flight.get(model_name, 0) if model_name else r.in_flight) == 0
        for r in control.replicas
    )


class _Lease:
    """Renews a pause a third of the way through its lease until stopped (the owner is alive and updating)."""

    def __init__(self, renew: Callable[[], Awaitable[object]], lease_s: float) -> None:
        self._renew = renew
        self._every_s = lease_s / 3
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.stop()
        self._task = asyncio.create_task(self._run(), name="agl-proxy-pause-lease")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._every_s)
            try:
                await self._renew()
            except Exception as exc:  # the next renewal tries again; the lease covers two misses
                log.warning("could not renew the proxies' pause: %s", exc)


class ProxyDrainer:
    def __init__(
        self,
        client: LedgerClient,
        *,
        retry_after_seconds: int = 5,
        timeout_s: float = 600.0,
        owner: str = "",
        lease_s: float = 0.0,
        model_name: str = "",
    ) -> None:
        self._client = client
        self._model_name = model_name
        self._retry_after_seconds = retry_after_seconds
        self._timeout_s = timeout_s
        self._owner = owner
        self._lease_s = lease_s
        self._reason = ""
        self._lease = _Lease(self._pause, lease_s) if lease_s else None

    async def _pause(self) -> proxy_control_pb2.ProxyControl:
        return await self._client.set_proxy_pause(
            True,
            retry_after_seconds=self._retry_after_seconds,
            reason=self._reason,
            owner=self._owner,
            lease_seconds=self._lease_s,
            model_name=self._model_name,
        )

    async def pause_and_drain(self, reason: str = "weight update") -> DrainResult:
        """Pauses every proxy and waits until no model call is in flight (or the timeout passes)."""
        started = time.monotonic()
        self._reason = reason
        control = await self._pause()
        if self._lease is not None:
            self._lease.start()
        generation = control.generation
        latest = control
        if not is_drained(latest, generation, self._model_name):

            async def wait() -> proxy_control_pb2.ProxyControl:
                async with contextlib.aclosing(self._client.watch_proxy_control()) as stream:
                    async for current in stream:
                        if is_drained(current, generation, self._model_name):
                            return current
                raise ConnectionError("proxy-control watch ended")

            try:
                latest = await asyncio.wait_for(wait(), timeout=self._timeout_s)
            except asyncio.TimeoutError:
                seconds = time.monotonic() - started
                log.warning("proxies not drained after %.1fs; updating weights anyway", seconds)
                return DrainResult(False, seconds, len(latest.replicas))
        seconds = time.monotonic() - started
        log.info("proxies paused and drained in %.3fs (%d replicas)", seconds, len(latest.replicas))
        return DrainResult(True, seconds, len(latest.replicas))

    async def resume(self) -> None:
        if self._lease is not None:
            self._lease.stop()
        await self._client.set_proxy_pause(False, reason="weights updated", model_name=self._model_name)


class HttpProxyDrainer:
    """The same through a proxy replica's admin API (POST /admin/drain, /admin/resume; master key)."""

    def __init__(
        self,
        admin_url: str,
        key: str | None,
        *,
        retry_after_seconds: int = 5,
        timeout_s: float = 600.0,
        owner: str = "",
        lease_s: float = 0.0,
        model_name: str = "",
    ):
        self._url = admin_url.rstrip("/")
        self._model = {"model": model_name} if model_name else {}
        self._headers = {"authorization": f"Bearer {key}"} if key else {}
        self._retry_after_seconds = retry_after_seconds
        self._timeout_s = timeout_s
        self._owner_lease: dict[str, object] = {"owner": owner, "lease_seconds": lease_s} if owner else {}
        self._reason = ""
        self._lease = _Lease(self._renew, lease_s) if owner and lease_s else None

    async def _renew(self) -> dict[str, object]:
        body = {"retry_after_seconds": self._retry_after_seconds, "reason": self._reason, **self._owner_lease}
        body.update(self._model)
        return await self._post("/admin/pause", body)

    async def _post(self, path: str, body: dict[str, object]) -> dict[str, object]:
        import httpx

        async with httpx.AsyncClient(timeout=self._timeout_s + 30.0) as client:
            reply = await client.post(f"{self._url}{path}", json=body, headers=self._headers)
            reply.raise_for_status()
            return reply.json()

    async def pause_and_drain(self, reason: str = "weight update") -> DrainResult:
        started = time.monotonic()
        self._reason = reason
        body = {"timeout_seconds": self._timeout_s, "retry_after_seconds": self._retry_after_seconds, "reason": reason}
        result = await self._post("/admin/drain", {**body, **self._owner_lease, **self._model})
        if self._lease is not None:
            self._lease.start()
        seconds = time.monotonic() - started
        replicas = result.get("replicas")
        count = len(replicas) if isinstance(replicas, list) else 0
        drained = bool(result.get("drained"))
        if not drained:
            log.warning("proxies not drained after %.1fs; updating weights anyway", seconds)
        return DrainResult(drained, seconds, count)

    async def resume(self) -> None:
        if self._lease is not None:
            self._lease.stop()
        await self._post("/admin/resume", dict(self._model))
