"""Pause, drain and resume the proxies around a weight update (async mode).

Goes through the ledger's proxy-control state, which every proxy replica follows: SetProxyPause(true)
bumps the control generation; each replica reports the generation it has applied and its in-flight model
calls. The proxies are drained when every live replica has applied the pause and has nothing in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

from services._gen.agl.v1 import proxy_control_pb2
from services.client import LedgerClient

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DrainResult:
    drained: bool
    seconds: float
    replicas: int


def is_drained(control: proxy_control_pb2.ProxyControl, generation: int) -> bool:
    return all(r.observed_generation >= generation and r.in_flight == 0 for r in control.replicas)


class ProxyDrainer:
    def __init__(self, client: LedgerClient, *, retry_after_seconds: int = 5, timeout_s: float = 600.0) -> None:
        self._client = client
        self._retry_after_seconds = retry_after_seconds
        self._timeout_s = timeout_s

    async def pause_and_drain(self, reason: str = "weight update") -> DrainResult:
        """Pauses every proxy and waits until no model call is in flight (or the timeout passes)."""
        started = time.monotonic()
        control = await self._client.set_proxy_pause(True, retry_after_seconds=self._retry_after_seconds, reason=reason)
        generation = control.generation
        latest = control
        if not is_drained(latest, generation):

            async def wait() -> proxy_control_pb2.ProxyControl:
                async with contextlib.aclosing(self._client.watch_proxy_control()) as stream:
                    async for current in stream:
                        if is_drained(current, generation):
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
        await self._client.set_proxy_pause(False, reason="weights updated")


class HttpProxyDrainer:
    """The same through a proxy replica's admin API (POST /admin/drain, /admin/resume; master key)."""

    def __init__(self, admin_url: str, key: str | None, *, retry_after_seconds: int = 5, timeout_s: float = 600.0):
        self._url = admin_url.rstrip("/")
        self._headers = {"authorization": f"Bearer {key}"} if key else {}
        self._retry_after_seconds = retry_after_seconds
        self._timeout_s = timeout_s

    async def _post(self, path: str, body: dict[str, object]) -> dict[str, object]:
        import httpx

        async with httpx.AsyncClient(timeout=self._timeout_s + 30.0) as client:
            reply = await client.post(f"{self._url}{path}", json=body, headers=self._headers)
            reply.raise_for_status()
            return reply.json()

    async def pause_and_drain(self, reason: str = "weight update") -> DrainResult:
        started = time.monotonic()
        body = {"timeout_seconds": self._timeout_s, "retry_after_seconds": self._retry_after_seconds, "reason": reason}
        result = await self._post("/admin/drain", body)
        seconds = time.monotonic() - started
        replicas = result.get("replicas")
        count = len(replicas) if isinstance(replicas, list) else 0
        drained = bool(result.get("drained"))
        if not drained:
            log.warning("proxies not drained after %.1fs; updating weights anyway", seconds)
        return DrainResult(drained, seconds, count)

    async def resume(self) -> None:
        await self._post("/admin/resume", {})
