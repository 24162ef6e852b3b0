"""Calls to the inference engines: one shared httpx client over a keep-alive pool, and the retry loop.

The pool (engine_pool.EnginePool) keeps every connection it opens alive for reuse: httpx's default pool keeps
only 20 idle connections, so above 20 concurrent calls it would close and reopen connections on nearly every call,
and its bookkeeping is quadratic in the number of connections.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import httpx

from services.client.retry import RetryPolicy
from services.printable import printable
from services.proxy.engines.pool import EnginePool
from services.proxy.engines.retry import parse_retry_after, retryable_status
from services.proxy.engines.routing import Endpoint
from services.proxy.errors import ProxyError

log = logging.getLogger(__name__)


class _NoCookies(httpx.Cookies):
    """A cookie jar that keeps nothing. One client serves every rollout, so a cookie set by an answer to one
    rollout's call must not ride along on the others' calls; and reading Set-Cookie on every answer (httpx builds
    urllib request/response adapters for it) cost about 6% of the proxy's CPU."""

    def extract_cookies(self, response: httpx.Response) -> None:
        return None


class _EngineClient(httpx.AsyncClient):
    """The shared httpx.AsyncClient, without a cookie jar (see _NoCookies)."""

    _no_cookies = _NoCookies()

    @property  # type: ignore[override]
    def cookies(self) -> httpx.Cookies:
        return self._no_cookies


_CLOSED = httpx.ByteStream(b"")  # the stream of a response that has been closed


async def close_response(response: httpx.Response) -> None:
    """Closes an engine's answer (again, harmlessly). httpx's client wraps the body in a stream that points back at
    the response; dropping it breaks that cycle, so the response and its request are freed as soon as the call is
    done rather than by the garbage collector, whose passes over them cost ~4% of the proxy's CPU."""
    await response.aclose()
    response.stream = _CLOSED


@dataclass
class UpstreamResult:
    endpoint: Endpoint
    retries: int
    response: httpx.Response | None = None  # body read, except for an open 2xx stream
    error: ProxyError | None = None  # set when no response could be had


class Upstream:
    def __init__(
        self,
        policy: RetryPolicy,
        *,
        max_connections: int,
        connect_timeout_s: float,
        read_timeout_s: float,
        api_key: str | None = None,
    ) -> None:
        self.policy = policy
        timeout = httpx.Timeout(connect=connect_timeout_s, read=read_timeout_s, write=60.0, pool=read_timeout_s)
        # Identity encoding: streamed bodies are parsed as they arrive, so they must not be compressed.
        headers = {"content-type": "application/json", "accept-encoding": "identity"}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        self.pool = EnginePool(max_connections=max_connections, keepalive_expiry_s=60.0)
        self.client = _EngineClient(transport=self.pool, timeout=timeout, trust_env=False, headers=headers)
        # Per endpoint and path: the parsed URL and the request's headers (Host, then the client's defaults).
        self._targets: dict[tuple[str, str], tuple[httpx.URL, list[tuple[bytes, bytes]]]] = {}
        # Requests carry the client's default headers and timeouts, built here rather than by build_request, which
        # merges URL, headers, cookies and timeouts afresh on every call (a third of the cost of a request).
        self._timeouts = self.client.timeout.as_dict()

    async def close(self) -> None:
        await self.client.aclose()

    def _request(self, endpoint: str, path: str, content: bytes) -> httpx.Request:
        """A POST of `content`, built with the body as a stream and Host and Content-Length given: httpx's
        content=... path reads the body back and re-derives those two headers through exception-raising lookups,
        19 us per request here against 6."""
        target = self._targets.get((endpoint, path))
        if target is None:
            if len(self._targets) > 4096:  # endpoints come and go over a long run
                self._targets.clear()
            url = httpx.URL(endpoint.rstrip("/") + path)
            target = self._targets[endpoint, path] = (url, [(b"Host", url.netloc), *self.client.headers.raw])
        url, headers = target
        return httpx.Request(
            "POST",
            url,
            headers=[*headers, (b"Content-Length", b"%d" % len(content))],
            stream=httpx.ByteStream(content),
            extensions={"timeout": self._timeouts},
        )

    async def call(
        self, endpoints: list[Endpoint], path: str, content: bytes, *, stream: bool, rollout_id: str
    ) -> UpstreamResult:
        """Posts to the best endpoint, retrying retryable failures down the ranking, with backoff."""
        attempts = self.policy.attempts
        for attempt in range(attempts):
            retries = attempt  # tries so far beyond the first
            endpoint = endpoints[attempt % len(endpoints)]
            last = attempt == attempts - 1
            retry_after: float | None = None
            error: ProxyError | None = None
            response: httpx.Response | None = None
            try:
                request = self._request(endpoint.url, path, content)
                response = await self.client.send(request, stream=True)
                status = response.status_code
                if not (stream and status < 300):
                    await response.aread()
                if status < 400 or last or not retryable_status(status):
                    return UpstreamResult(endpoint, retries, response=response)
                retry_after = parse_retry_after(response.headers.get("retry-after"))
                what = f"HTTP {status}"
            except httpx.TimeoutException as err:
                error = ProxyError("upstream_timeout", f"The engine at {endpoint.url} timed out: {type(err).__name__}.")
                what = type(err).__name__
            except httpx.InvalidURL as err:  # stored before the ledger checked URLs: one failed try, as a dead engine
                shown = printable(endpoint.url)
                error = ProxyError("upstream_unreachable", f"The engine URL {shown} is not a usable URL: {err}")
                what = "InvalidURL"
            except httpx.TransportError as err:
                error = ProxyError(
                    "upstream_unreachable", f"The engine at {endpoint.url} failed: {type(err).__name__}: {err}"
                )
                what = type(err).__name__
            finally:
                if response is not None and not (stream and response.status_code < 300):
                    await close_response(response)
            if last:
                log.warning("rollout %s: engine call failed after %d attempt(s): %s", rollout_id, attempts, what)
                return UpstreamResult(endpoint, retries, error=error)
            delay = self.policy.backoff(attempt + 1, retry_after)
            log.info(
                "rollout %s: engine %s answered %s; retry %d in %.3fs",
                rollout_id,
                endpoint.url,
                what,
                attempt + 1,
                delay,
            )
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")
