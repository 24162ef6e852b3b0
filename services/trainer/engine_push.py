"""New weights to the engines AGL did not start: every endpoint the ledger has for the model reloads the
file the actor just wrote, forgets its prefix cache, and is re-registered at the new version.

An engine that refuses (HTTP error, unreachable) fails the step with its own message: training on while one
engine serves old weights would silently mix policies. The proxies are paused and drained by the caller
around the push, so no model call straddles two weight versions.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from services._gen.agl.v1 import model_pb2
from services.client import LedgerClient

log = logging.getLogger(__name__)


class EnginePushError(RuntimeError):
    """An engine did not take the new weights."""


def admin_base(endpoint: str) -> str:
    """The engine's root URL from its registered OpenAI base URL ("http://h:p/v1" -> "http://h:p")."""
    base = endpoint.rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


@dataclass(frozen=True)
class PushResult:
    endpoints: list[str]
    seconds: float
    slowest_s: float


async def registered_endpoints(ledger: LedgerClient, model_name: str) -> list[model_pb2.ModelEndpoint]:
    endpoints = await ledger.list_models(model_name)
    if not endpoints:
        raise EnginePushError(
            f"no engine is registered for model {model_name!r}: start one and register it (see the README's Engine "
            f"section), or train with verl's own vLLM replicas (agl.engines.external=false)"
        )
    return endpoints


async def _post(client: httpx.AsyncClient, url: str, body: dict | None = None) -> None:
    try:
        reply = await client.post(url, json=body)
    except httpx.HTTPError as err:
        raise EnginePushError(f"{url}: {type(err).__name__}: {err}") from err
    if reply.status_code >= 400:
        raise EnginePushError(f"{url}: HTTP {reply.status_code}: {reply.text[:500]}")


async def reload_engine(client: httpx.AsyncClient, endpoint: str, weights_dir: Path, version: int) -> float:
    started = time.perf_counter()
    base = admin_base(endpoint)
    body = {"method": "reload_weights", "kwargs": {"weights_path": str(weights_dir)}}
    await _post(client, f"{base}/collective_rpc", body)
    await _post(client, f"{base}/reset_prefix_cache")
    await _post(client, f"{base}/update_weight_version", {"new_version": str(version)})
    return time.perf_counter() - started


async def push_weights(
    ledger: LedgerClient,
    model_name: str,
    weights_dir: Path,
    version: int,
    *,
    timeout_s: float = 300.0,
    endpoints: Sequence[model_pb2.ModelEndpoint] | None = None,
) -> PushResult:
    """Reloads every registered engine of the model from weights_dir, then records `version` on them."""
    started = time.perf_counter()
    targets = list(endpoints) if endpoints is not None else await registered_endpoints(ledger, model_name)
    async with httpx.AsyncClient(timeout=timeout_s) as client:
        seconds = await asyncio.gather(*(reload_engine(client, e.endpoint, weights_dir, version) for e in targets))
    await ledger.register_models(
        [model_pb2.ModelEndpoint(model_name=model_name, endpoint=e.endpoint, version=version) for e in targets]
    )
    names = [e.endpoint for e in targets]
    log.info("weights v%d pushed to %d engine(s) in %.3fs", version, len(names), time.perf_counter() - started)
    return PushResult(names, time.perf_counter() - started, max(seconds, default=0.0))
