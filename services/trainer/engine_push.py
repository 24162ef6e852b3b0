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

from services._gen.agl.v1 import model_pb2
from services.client import LedgerClient
from services.engine.control import EngineControl, EngineError

log = logging.getLogger(__name__)


class EnginePushError(RuntimeError):
    """An engine did not take the new weights, or there is no engine to push to."""


@dataclass(frozen=True)
class PushResult:
    endpoints: list[str]
    seconds: float
    slowest_s: float


async def registered_endpoints(ledger: LedgerClient, model_name: str) -> list[model_pb2.ModelEndpoint]:
    endpoints = await ledger.list_models(model_name)
    if not endpoints:
        raise EnginePushError(
            f"no engine is registered for model {model_name!r}: start one and register it (see "
            f"docs/reference/engine.md), or train with verl's own vLLM replicas (agl.engines.external=false)"
        )
    return endpoints


async def _push_one(endpoint: str, weights_dir: Path, version: int, timeout_s: float) -> float:
    try:
        async with EngineControl(endpoint, timeout_s=timeout_s) as engine:
            reload = await engine.push_weights(weights_dir, version)
    except EngineError as err:
        raise EnginePushError(str(err)) from err
    return reload.seconds


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
    seconds = await asyncio.gather(*(_push_one(e.endpoint, weights_dir, version, timeout_s) for e in targets))
    await ledger.register_models(
        [model_pb2.ModelEndpoint(model_name=model_name, endpoint=e.endpoint, version=version) for e in targets]
    )
    names = [e.endpoint for e in targets]
    log.info("weights v%d pushed to %d engine(s) in %.3fs", version, len(names), time.perf_counter() - started)
    return PushResult(names, time.perf_counter() - started, max(seconds, default=0.0))
