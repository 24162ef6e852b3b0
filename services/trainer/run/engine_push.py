"""New weights to the engines AGL did not start: every endpoint the ledger has for the model reloads the
file the actor just wrote, forgets its prefix cache, and is re-registered at the new version. A LoRA run's
engines load the adapter's new version under the model's name instead (Weights.adapter; run/lora.py).

An engine that refuses (an HTTP error) fails the step with its own message: training on while one engine serves
old weights would silently mix policies. One that cannot be reached (dead, restarting) is registered at the new
version with a label no engine reports (`pending`): the proxies hold it back, and the trainer's next catch-up,
during the next step's rollouts or before it, gives it the weights once it answers. The proxies are paused and
drained by the caller around the push, so no model call straddles two weight versions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from services._gen.agl.v1 import model_pb2
from services.client import LedgerClient
from services.engine.control import EngineControl, EngineError, Reload, adapter_label
from services.trainer.run.lora import adapter_dir

log = logging.getLogger(__name__)
T = TypeVar("T")


class EnginePushError(RuntimeError):
    """An engine did not take the new weights, or there is no engine to push to; `unreachable`: no answer at all."""

    def __init__(self, message: str, unreachable: bool = False) -> None:
        super().__init__(message)
        self.unreachable = unreachable


@dataclass(frozen=True)
class PushResult:
    endpoints: list[str]
    seconds: float
    slowest_s: float
    deferred: list[str] = field(default_factory=list)  # unreachable: held back until a catch-up


async def registered_endpoints(ledger: LedgerClient, model_name: str) -> list[model_pb2.ModelEndpoint]:
    endpoints = await ledger.list_models(model_name)
    if not endpoints:
        raise EnginePushError(
            f"no engine is registered for model {model_name!r}: start one and register it (see "
            f"docs/reference/engine.md), or train with verl's own vLLM replicas (agl.engines.external=false)"
        )
    return endpoints


@dataclass(frozen=True)
class Weights:
    """What the actor writes for the engines: its full weights (one file in `dir`), or, with `adapter`, a LoRA
    adapter per version (dir/adapter-v<N>) that the engines load under the model's name; `api_key`: the bearer key
    of the engines' /v1 routes (vLLM --api-key), which an adapter's load and its version's read go through."""

    dir: Path
    adapter: bool = False
    api_key: str | None = field(default=None, repr=False)

    def written(self, version: int) -> bool:
        if self.adapter:
            return adapter_dir(self.dir, version).is_dir()
        return any(self.dir.glob("*.safetensors"))

    def label(self, version: int) -> str:
        """What an engine serving `version` reports (full weights: /weight_info; an adapter: its directory)."""
        return adapter_label(adapter_dir(self.dir, version)) if self.adapter else str(version)

    async def load(self, engine: EngineControl, model_name: str, version: int) -> Reload:
        if self.adapter:
            return await engine.load_adapter(model_name, adapter_dir(self.dir, version))
        return await engine.push_weights(self.dir, version)

    async def served(self, engine: EngineControl, model_name: str) -> str:
        return await engine.served_adapter(model_name) if self.adapter else await engine.weight_version()


def pushed(model_name: str, endpoint: str, version: int, label: str | None = None) -> model_pb2.ModelEndpoint:
    """The registration of an engine given the weights of `version`: the label it reports for them is recorded
    too, so the proxies can tell when it serves something else (a restart: services/proxy/engines/weight_check.py)."""
    return model_pb2.ModelEndpoint(
        model_name=model_name, endpoint=endpoint, version=version, weight_label=str(version) if label is None else label
    )


def pending(model_name: str, endpoint: str, version: int) -> model_pb2.ModelEndpoint:
    """The registration of an engine that could not be given the weights of `version`: at that version (so no
    stale version is the model's newest), with a label no engine reports, so the proxies hold it back."""
    return model_pb2.ModelEndpoint(
        model_name=model_name, endpoint=endpoint, version=version, weight_label=f"pending {version}"
    )


async def _push_one(endpoint: str, model_name: str, weights: Weights, version: int, timeout_s: float) -> float:
    try:
        async with EngineControl(endpoint, api_key=weights.api_key, timeout_s=timeout_s) as engine:
            reload = await weights.load(engine, model_name, version)
    except EngineError as err:
        raise EnginePushError(str(err), unreachable=err.status is None) from err
    return reload.seconds


async def push_weights(
    ledger: LedgerClient,
    model_name: str,
    weights: Weights | Path,
    version: int,
    *,
    timeout_s: float = 300.0,
    endpoints: Sequence[model_pb2.ModelEndpoint] | None = None,
) -> PushResult:
    """Reloads every registered engine of the model from `weights` (a Path: full weights there), then records
    `version` on them."""
    weights = weights if isinstance(weights, Weights) else Weights(weights)
    started = time.perf_counter()
    targets = list(endpoints) if endpoints is not None else await registered_endpoints(ledger, model_name)
    outcomes = await asyncio.gather(
        *(_push_one(e.endpoint, model_name, weights, version, timeout_s) for e in targets), return_exceptions=True
    )
    done, away = [], []
    for endpoint, outcome in zip(targets, outcomes, strict=True):
        if not isinstance(outcome, BaseException):
            done.append(endpoint)
        elif isinstance(outcome, EnginePushError) and outcome.unreachable:
            log.warning("engine %s: not reached (%s); held back until it is given weights v%d", endpoint.endpoint,
                        outcome, version)  # fmt: skip
            away.append(endpoint)
        else:
            raise outcome
    registrations = [pushed(model_name, e.endpoint, version, weights.label(version)) for e in done]
    await ledger.register_models(registrations + [pending(model_name, e.endpoint, version) for e in away])
    names = [e.endpoint for e in done]
    log.info("weights v%d pushed to %d engine(s) in %.3fs", version, len(names), time.perf_counter() - started)
    seconds = [outcome for outcome in outcomes if isinstance(outcome, float)]
    return PushResult(
        names, time.perf_counter() - started, max(seconds, default=0.0), deferred=[e.endpoint for e in away]
    )


async def _serves(
    endpoint: str, model_name: str, weights: Weights, version: int, level: int = logging.WARNING
) -> bool | None:
    """Whether the engine serves the weights of `version`; None when it does not answer (the proxies fail over)."""
    try:
        async with EngineControl(endpoint, api_key=weights.api_key, timeout_s=10.0) as engine:
            return await weights.served(engine, model_name) == weights.label(version)
    except EngineError as err:
        log.log(level, "engine %s: its weight version could not be read (%s)", endpoint, err)
        return None


async def catch_up(
    ledger: LedgerClient,
    model_name: str,
    weights: Weights | Path,
    version: int,
    endpoints: Sequence[model_pb2.ModelEndpoint],
    *,
    unreadable_level: int = logging.WARNING,
) -> list[str]:
    """Pushes the weights of `version` (the file last pushed) to the engines that do not serve them; their URLs.

    An engine restarted since the last push serves its base model while the registry still lists it at the
    version it had: before a step's rollouts, each engine's own label is read and one that disagrees (or one
    registered at another version, as a re-registered engine is) gets the current weights again, so no rollout of
    the step samples from stale weights. Nothing is pushed before the first update (no file yet)."""
    weights = weights if isinstance(weights, Weights) else Weights(weights)
    if version <= 0 or not weights.written(version):
        return []
    label = weights.label(version)
    labels = await asyncio.gather(
        *(_serves(e.endpoint, model_name, weights, version, unreadable_level) for e in endpoints)
    )
    behind = [e for e, serves in zip(endpoints, labels, strict=True) if serves is False]
    # Serving the current weights but registered otherwise (registered again by hand): the record only.
    relabel = [
        e
        for e, serves in zip(endpoints, labels, strict=True)
        if serves and (e.version != version or e.weight_label != label)
    ]
    if relabel:
        await ledger.register_models([pushed(model_name, e.endpoint, version, label) for e in relabel])
    if behind:
        names = ", ".join(e.endpoint for e in behind)
        log.warning("engine(s) %s do not serve weights v%d (restarted?): pushing them again", names, version)
        await push_weights(ledger, model_name, weights, version, endpoints=behind)
    return [e.endpoint for e in behind]


async def while_catching_up(
    work: Awaitable[T], ledger: LedgerClient, model_name: str, weights: Weights | Path, version: int, interval_s: float
) -> tuple[T, list[str]]:
    """`work` (a step's rollouts), and meanwhile every `interval_s` a catch-up of the model's engines; returns what
    `work` returned and the engines caught up.

    An engine that restarts while the step's rollouts run would otherwise serve its base weights (or, held back by
    the proxies, nothing) until the next step. A failed round (the engine still loading, the ledger away) is
    logged and tried again at the next one; the proxies keep such an engine held back meanwhile."""
    caught: list[str] = []

    async def watch() -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                endpoints = await ledger.list_models(model_name)
                caught.extend(
                    await catch_up(ledger, model_name, weights, version, endpoints, unreadable_level=logging.DEBUG)
                )
            except Exception as err:  # EnginePushError, the ledger away: the next round tries again
                log.warning("catching up the engines during the step failed (%s); again in %.1fs", err, interval_s)

    watcher = asyncio.create_task(watch())
    try:
        return await work, caught
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


async def until_one_serves(
    ledger: LedgerClient,
    model_name: str,
    weights: Weights | Path,
    version: int,
    *,
    timeout_s: float,
    interval_s: float = 2.0,
) -> float:
    """Waits until an engine of the model serves the weights of `version` (before any push: until one answers),
    catching up those that restarted meanwhile; the seconds it took. EnginePushError when none does in `timeout_s`.

    What a step that lost all its rollouts to the infrastructure waits for before it runs again: running it while
    every engine is still away would lose it once more."""
    weights = weights if isinstance(weights, Weights) else Weights(weights)
    started = time.monotonic()
    last = "no engine is registered"
    while True:
        try:
            endpoints = await ledger.list_models(model_name)
            if endpoints:
                serving = await asyncio.gather(*(_serves(e.endpoint, model_name, weights, version, logging.DEBUG)
                                                 for e in endpoints))  # fmt: skip
                pushed_yet = version > 0 and weights.written(version)
                if any(s if pushed_yet else s is not None for s in serving):
                    return time.monotonic() - started
                last = f"{len(endpoints)} registered, none serving weights v{version}"
                # One that answers with other weights (restarted) is given them; the next round reads it again.
                behind = [e for e, s in zip(endpoints, serving, strict=True) if s is False]
                if behind:
                    await push_weights(ledger, model_name, weights, version, endpoints=behind)
        except Exception as err:  # the ledger away, an engine still loading: the next round tries again
            last = str(err)
        if time.monotonic() - started >= timeout_s:
            raise EnginePushError(
                f"no engine of model {model_name!r} served weights v{version} within {timeout_s:g}s ({last})",
                unreachable=True,
            )
        await asyncio.sleep(interval_s)
