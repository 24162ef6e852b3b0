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


async def _serves(endpoint: str, version: int) -> bool | None:
    """Whether the engine labels its weights `version`; None when it does not answer (the proxies fail over)."""
    try:
        async with EngineControl(endpoint, timeout_s=10.0) as engine:
            return await engine.weight_version() == str(version)
    except EngineError as err:
        log.warning("engine %s: its weight version could not be read (%s)", endpoint, err)
        return None


async def catch_up(
    ledger: LedgerClient, model_name: str, weights_dir: Path, version: int, endpoints: Sequence[model_pb2.ModelEndpoint]
) -> list[str]:
    """Pushes the weights of `version` (the file last pushed) to the engines that do not serve them; their URLs.

    An engine restarted since the last push serves its base model while the registry still lists it at the
    version it had: before a step's rollouts, each engine's own label is read and one that disagrees (or one
    registered at another version, as a re-registered engine is) gets the current weights again, so no rollout of
    the step samples from stale weights. Nothing is pushed before the first update (no file yet)."""
    if version <= 0 or not any(weights_dir.glob("*.safetensors")):
        return []
    labels = await asyncio.gather(*(_serves(e.endpoint, version) for e in endpoints))
    behind = [e for e, serves in zip(endpoints, labels, strict=True) if serves is False]
    # Serving the current weights but registered at another version (registered again by hand): the record only.
    relabel = [e for e, serves in zip(endpoints, labels, strict=True) if serves and e.version != version]
    if relabel:
        await ledger.register_models(
            [model_pb2.ModelEndpoint(model_name=model_name, endpoint=e.endpoint, version=version) for e in relabel]
        )
    if behind:
        names = ", ".join(e.endpoint for e in behind)
        log.warning("engine(s) %s do not serve weights v%d (restarted?): pushing them again", names, version)
        await push_weights(ledger, model_name, weights_dir, version, endpoints=behind)
    return [e.endpoint for e in behind]
