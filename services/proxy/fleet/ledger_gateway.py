"""The proxy's side of the ledger: rollout checks (with a small status cache), appends, and the models stream.

A call is checked before it is forwarded: unknown rollout -> 404, terminal -> 409, so no engine time is spent on
it. The check reads a cache: terminal rollouts are remembered for good, live ones for a minute by default. A
live entry can go stale (the rollout finished or was deleted since): the ledger refuses appends to a finished
rollout by default (the proxy never sets allow_terminal), so such a call still gets 409 (or 404) and leaves
nothing in the ledger, and the answer updates the cache, so a stale entry costs at most one engine call.
Re-checking live rollouts more often cost a GetRollout per rollout per interval, about 3% of the proxy's CPU in
the benchmark at a 5 s interval.

Appends go through LedgerClient.append_events, which merges concurrent calls into shared AppendEvents requests
sent over one long-lived append stream, re-opened when the ledger goes away for a while; the whole append is
bounded by the proxy's ledger timeout, after which the agent gets 503 rather than being left waiting.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from services._gen.agl.v1 import event_pb2, ledger_service_pb2, rollout_pb2
from services.client import DeadlineExceeded, LedgerClient, LedgerError
from services.printable import printable
from services.proxy.engines.model_tables import ModelRoutes, RolloutModels, rollout_models
from services.proxy.engines.routing import Endpoint
from services.proxy.errors import ProxyError, from_ledger

log = logging.getLogger(__name__)

V1_ATTEMPT = "0"  # Agent Lightning v1.0's only attempt id
_TERMINAL = frozenset({rollout_pb2.ROLLOUT_STATE_SUCCEEDED, rollout_pb2.ROLLOUT_STATE_FAILED})
_CACHE_SIZE = 100_000


def _finished(rollout_id: str) -> ProxyError:
    return ProxyError("rollout_terminal", f"Rollout {rollout_id} has finished; it takes no more calls or events.")


def _missing(rollout_id: str) -> ProxyError:
    return ProxyError("rollout_not_found", f"Rollout {rollout_id} does not exist.")


async def _translated(what: str, call: Awaitable[Any]) -> Any:
    try:
        return await call
    except LedgerError as err:
        raise from_ledger(err, what) from None


class LedgerGateway:
    def __init__(self, client: LedgerClient, cache_ttl_s: float, append_timeout_s: float) -> None:
        self.client = client
        self._append_timeout = append_timeout_s
        self._ttl = cache_ttl_s
        # rollout id -> (state, attempt id, checked at, where its labels send its calls)
        self._states: OrderedDict[str, tuple[int, str, float, RolloutModels]] = OrderedDict()
        self._pending: dict[str, asyncio.Future[tuple[int, str, RolloutModels]]] = {}

    # -- rollouts ---------------------------------------------------------------------------------------------

    async def check_rollout(self, rollout_id: str, attempt_id: str) -> RolloutModels:
        """Raises 404 for an unknown rollout or an attempt other than the rollout's, 409 for a finished rollout, 503
        when the ledger cannot say. Returns where the rollout's labels send its calls (its model, its role map)."""
        state, attempt, models = await self._state(rollout_id)
        if state in _TERMINAL:
            raise _finished(rollout_id)
        if attempt != attempt_id:
            # The cached entry may predate the attempt (the rollout was seen queuing): ask the ledger once more.
            state, attempt, models = await self._state(rollout_id, fresh=True)
            if state in _TERMINAL:
                raise _finished(rollout_id)
            if attempt != attempt_id:
                raise ProxyError(
                    "rollout_not_found", f"Rollout {rollout_id} has no attempt {attempt_id} (its attempt is {attempt})."
                )
        return models

    async def model_of(self, rollout_id: str) -> str:
        """The model the rollout's label names ("": none, the proxy's own), whatever its state; 404 for an unknown
        rollout."""
        _, _, models = await self._state(rollout_id)
        return models.model

    async def v1_attempt(self, rollout_id: str) -> str:
        """The attempt Agent Lightning v1.0's constant attempt "0" names on this rollout (for master-key callers):
        an attempt that is literally "0" (claimed by v1.0's controller), else the rollout's current attempt, else
        none ("": the ledger files the event under the rollout's latest attempt, or under no attempt while the
        rollout has never been claimed). 404 for an unknown rollout."""
        _, attempt, _ = await self._state(rollout_id)
        if attempt == V1_ATTEMPT:
            return attempt
        _, attempt, _ = await self._state(rollout_id, fresh=True)  # the cache may predate a claim
        return attempt

    async def _state(self, rollout_id: str, fresh: bool = False) -> tuple[int, str, RolloutModels]:
        cached = self._states.get(rollout_id)
        if cached is not None and not fresh and (cached[0] in _TERMINAL or time.monotonic() - cached[2] < self._ttl):
            return cached[0], cached[1], cached[3]
        pending = self._pending.get(rollout_id)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[tuple[int, str, RolloutModels]] = asyncio.get_running_loop().create_future()
        self._pending[rollout_id] = future
        try:
            rollout = await _translated("GetRollout", self.client.get_rollout(rollout_id))
        except ProxyError as err:
            if err.kind == "rollout_not_found":
                err = _missing(rollout_id)
            future.set_exception(err)
            future.exception()  # marked as retrieved: waiters are optional
            raise err from None
        except BaseException:
            future.cancel()
            raise
        finally:
            del self._pending[rollout_id]
        state, attempt = rollout.status.state, rollout.status.attempt_id
        models = rollout_models(rollout.metadata.labels)
        self._remember(rollout_id, state, attempt, models)
        future.set_result((state, attempt, models))
        return state, attempt, models

    def _remember(self, rollout_id: str, state: int, attempt_id: str, models: RolloutModels | None = None) -> None:
        self._states[rollout_id] = (state, attempt_id, time.monotonic(), models or RolloutModels())
        self._states.move_to_end(rollout_id)
        while len(self._states) > _CACHE_SIZE:
            self._states.popitem(last=False)

    # -- events -----------------------------------------------------------------------------------------------

    async def calls_of(self, rollout_id: str, attempt_id: str) -> list[event_pb2.ModelRequest]:
        """The model calls recorded for a rollout attempt, oldest first (the responses a Responses request may
        continue or an agent may fetch again: dialects/responses_chain.py)."""
        events = await _translated(
            "ListEvents", self.client.list_events(rollout_id, attempt_id=attempt_id, event_type="model_request")
        )
        return [event.model_request for event in events]

    async def append(self, event: event_pb2.Event) -> int:
        """Appends one event, refused when its rollout is terminal; returns its sequence."""
        return (await self.append_filed(event))[0]

    async def append_filed(self, event: event_pb2.Event) -> tuple[int, str]:
        """Appends one event as `append` does; returns its sequence and the attempt the ledger filed it under."""
        try:
            response = await self._append(event)
        except ProxyError as err:
            if err.kind == "rollout_terminal":
                self._remember(event.rollout_id, rollout_pb2.ROLLOUT_STATE_SUCCEEDED, event.attempt_id)
                raise _finished(event.rollout_id) from None
            if (
                err.kind == "rollout_not_found"
            ):  # deleted (or a new attempt) since it was cached: checked afresh next time
                self._states.pop(event.rollout_id, None)
                raise ProxyError("rollout_not_found", err.message) from None
            raise
        if not response.sequences:
            return 0, event.attempt_id
        return response.sequences[0], response.attempt_ids[0] if response.attempt_ids else event.attempt_id

    async def _append(self, event: event_pb2.Event) -> ledger_service_pb2.AppendEventsResponse:
        try:
            return await self.client.append_events([event], timeout_s=self._append_timeout)
        except DeadlineExceeded:
            raise ProxyError(
                "ledger_unavailable",
                f"The ledger did not acknowledge within {self._append_timeout:g}s; the call was not recorded.",
            ) from None
        except LedgerError as err:
            raise from_ledger(err, "AppendEvents") from None
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # this call itself is cancelled
            # The client was closed under the append (the proxy is stopping).
            raise ProxyError("ledger_unavailable", "The proxy is shutting down.") from None

    @property
    def append_requests(self) -> int:
        """AppendEvents requests sent so far (fewer than appends when concurrent ones were merged)."""
        return self.client.append_requests

    # -- models -----------------------------------------------------------------------------------------------

    async def follow_models(self, routes: ModelRoutes, on_change: Callable[[], None]) -> None:
        """Keeps every model's routing table equal to the registry's endpoint set (runs until cancelled); from a
        cut of the stream to the next set, the tables are marked as possibly behind (ModelRoutes.current)."""

        def cut() -> None:
            if routes.current:
                log.warning("model registry stream cut: calls wait until the registry is read again")
            routes.lost()

        async for message in self.client.watch_models(on_cut=cut):
            routes.update(
                (
                    (e.model_name, Endpoint(url=e.endpoint, version=e.version, weight_label=e.weight_label))
                    for e in message.endpoints
                ),
                message.revision,
            )
            on_change()
            for table in routes.tables:
                log.info(
                    "model %s: %d endpoint(s) at revision %d: %s",
                    printable(table.model_name),
                    len(table.endpoints),
                    message.revision,
                    printable(", ".join(f"{e.url}@v{e.version}" for e in table.endpoints)) or "none",
                )
                if table.stale:
                    log.warning(
                        "model %s: %s held back from routing until they serve the current version v%d",
                        printable(table.model_name),
                        printable(", ".join(f"{e.url}@v{e.version}" for e in table.stale)),
                        max(e.version for e in table.endpoints),
                    )
