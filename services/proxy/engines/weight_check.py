"""Holds back engines that would serve the wrong weights or none: each endpoint's own weight label, read often.

The registry says which weights an endpoint serves; since the trainer's push also records the label it gave the
engine (`ModelEndpoint.weight_label`), the engine itself can be asked (vLLM's dev-mode `GET /weight_info`). The two
disagree when an engine restarted: it serves its base model, labelled `default`, while the registry still lists
it at the last push, and every rollout routed to it until the trainer's next push would sample from stale weights.
So every endpoint's label is read every `interval_s`, at once when the registry changes and when a call found an
engine unreachable; an endpoint whose engine reports another label than registered, or refuses connections, is
held back (engines/routing.py) until it agrees again (the trainer catches a restarted engine up during the step:
services/trainer/run/engine_push.py). An endpoint registered without a label (by hand, verl's own replicas) is held
back only while it refuses connections. A slow answer (a busy engine) changes nothing. A LoRA run's endpoint is
registered with its adapter's directory as the label (`adapter:<dir>`): its engine's `GET /v1/models` says which
directory the adapter of the model's name was loaded from (none after a restart). Every model's table is checked
(engines/model_tables.py): an engine serving two runs' adapters is read once for each, and held back for one run while
its adapter for that run is missing, without holding back the other's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import httpx

from services.engine.control import ADAPTER_LABEL, served_adapter_label
from services.proxy.engines.model_tables import ModelRoutes
from services.proxy.engines.routing import Endpoint
from services.proxy.errors import ProxyError

log = logging.getLogger(__name__)

# vLLM's label for the weights an engine started with (EngineCore's first weight version).
BASE_LABEL = "default"
UNREACHABLE = "unreachable"
# What an agent is told to wait when every engine is held back: a restarted engine is caught up by the trainer
# within a few seconds of answering again.
RETRY_AFTER_S = 2


def not_current_error(model_name: str, held: dict[str, str]) -> ProxyError:
    """The answer to a call that found every engine of the model held back, naming each and why."""
    why = "; ".join(f"{url} {reason}" for url, reason in sorted(held.items()))
    return ProxyError(
        "engine_not_current",
        f"No engine of model {model_name} serves the registered weights now ({why}); retry shortly.",
        headers={"retry-after": str(RETRY_AFTER_S)},
    )


def label_verdict(label: str, expected: str) -> str | None:
    """Why an engine reporting `label` must not serve as registered with `expected`; None when it may."""
    if not expected or label == expected:
        return None
    return f"reports weights {label!r}, registered as {expected!r}"


async def probe(
    client: httpx.AsyncClient, endpoint: Endpoint, timeout_s: float, model_name: str = ""
) -> str | bool | None:
    """One endpoint's state: why to hold it (a reason), that it may serve (True), or that nothing is known (None)."""
    root = endpoint.url.rstrip("/").removesuffix("/v1")
    adapter = endpoint.weight_label.startswith(ADAPTER_LABEL)
    try:
        response = await client.get(f"{root}/v1/models" if adapter else f"{root}/weight_info", timeout=timeout_s)
    except httpx.ConnectError as err:
        return f"{UNREACHABLE} ({type(err).__name__}: {err})"
    except httpx.HTTPError:  # slow, or an answer cut off: a busy engine is not a stale one
        return None
    if response.status_code in (404, 405):  # no label to read: it answers, which is all that can be known
        return True
    if response.status_code != 200:
        return None
    try:
        body = response.json()
        label = served_adapter_label(body, model_name) if adapter else body["weight_version"]
    except (ValueError, KeyError, TypeError):
        return None
    return label_verdict(str(label), endpoint.weight_label) or True


class EngineChecker:
    """Reads the labels of the routing table's endpoints and holds back or releases each (the module's docstring)."""

    def __init__(
        self,
        routing: ModelRoutes,
        interval_s: float,
        *,
        api_key: str | None = None,
        timeout_s: float = 5.0,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.routing = routing
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.on_change = on_change
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.AsyncClient(headers=headers, trust_env=False)
        self._wake = asyncio.Event()

    def poke(self) -> None:
        """Checks again now (the registry changed, or a call found an engine unreachable)."""
        self._wake.set()

    async def check(self) -> None:
        pairs = [(table, e) for table in self.routing.tables for e in table.endpoints]
        states = await asyncio.gather(*(probe(self._client, e, self.timeout_s, t.model_name) for t, e in pairs))
        changed = False
        for (table, endpoint), state in zip(pairs, states, strict=True):
            if state is True and table.release(endpoint.url):
                changed = True
                log.info(
                    "engine %s serves what model %s is registered with again: routed to", endpoint.url, table.model_name
                )
            elif isinstance(state, str) and table.hold(endpoint.url, state):
                changed = True
                # Another label than its base one: a push between its reload and its registration, not a restart.
                restarted = f"{BASE_LABEL!r}," in state or f"'{ADAPTER_LABEL}none'," in state
                pushing = not state.startswith(UNREACHABLE) and not restarted
                level = logging.INFO if pushing else logging.WARNING
                log.log(level, "engine %s held back for model %s: %s", endpoint.url, table.model_name, state)
        if changed and self.on_change is not None:
            self.on_change()

    async def run(self) -> None:
        try:
            while True:
                self._wake.clear()
                try:
                    await self.check()
                except Exception:  # one bad round must not end the checking
                    log.exception("engine check failed")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.interval_s)
        finally:
            await self._client.aclose()
