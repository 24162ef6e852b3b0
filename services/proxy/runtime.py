"""The running proxy: the parts one proxy process builds at startup (ledger client, coordinator, routing, the
engines' connection pool, the model-call core), their start and stop, and how a route reaches them.

Routes are module-level functions (routes/agent.py, routes/admin.py, routes/ops.py) and find the runtime through
their request (`runtime_of`), so nothing is captured in a closure of the app's factory.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import socket
import uuid

from starlette.requests import Request

from services.client import LedgerClient, LedgerError, RetryPolicy, backoff_s
from services.proxy.auth import Authorizer
from services.proxy.background import stop_tasks
from services.proxy.call.continuation import TokenContinuation
from services.proxy.call.pipeline import ModelCalls
from services.proxy.call.rewrite import RewriteSettings
from services.proxy.call.token_history import TokenHistory
from services.proxy.config import ProxyConfig
from services.proxy.engines.model_tables import ModelRoutes
from services.proxy.engines.upstream import Upstream
from services.proxy.engines.weight_check import EngineChecker
from services.proxy.fleet.coordination import Coordinator
from services.proxy.fleet.ledger_gateway import LedgerGateway
from services.proxy.fleet.readiness import Readiness
from services.proxy.metrics import ProxyMetrics

log = logging.getLogger(__name__)

_STARTUP_SYNC_S = 3.0


class ProxyRuntime:
    """The parts of one proxy process, built at startup and shared by every route (`app.state.runtime`)."""

    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.metrics = ProxyMetrics()
        self.auth = Authorizer(config.key)
        self.client = LedgerClient(config.ledger, config.key, call_timeout_s=config.ledger_timeout_s)
        self.gateway = LedgerGateway(self.client, config.rollout_cache_ttl_s, config.ledger_timeout_s)
        replica_id = config.replica_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.readiness = Readiness(config.ledger)
        self.coordinator = Coordinator(
            self.client, replica_id, config.heartbeat_s, config.replica_ttl_s, self.metrics, self.readiness
        )
        # Every registered model's endpoints; a rollout goes to its label's model, else to config.model_name.
        self.routing = ModelRoutes(config.model_name)
        policy = RetryPolicy(config.retry_attempts, config.retry_initial_backoff_s, config.retry_max_backoff_s)
        self.upstream = Upstream(
            policy,
            max_connections=config.max_connections,
            connect_timeout_s=config.connect_timeout_s,
            read_timeout_s=config.read_timeout_s,
            api_key=config.engine_api_key,
        )
        settings = RewriteSettings(config.model_name, config.train_temperature, config.val_temperature, config.logprobs)
        continuation = (
            TokenContinuation(
                self.upstream.client, TokenHistory(config.token_continuation_rollouts), self.metrics.token_continuations
            )
            if config.token_continuation
            else None
        )
        self.calls = ModelCalls(
            settings,
            self.gateway,
            self.coordinator,
            self.routing,
            self.upstream,
            self.metrics,
            continuation,
            config.request_limits,
            config.engine_wait_s,
        )
        self.engine_check = (
            EngineChecker(
                self.routing, config.engine_check_s, api_key=config.engine_api_key, on_change=self._routing_changed
            )
            if config.engine_check_s > 0
            else None
        )
        self.calls.on_unreachable = self.engine_check.poke if self.engine_check is not None else None
        self._models_seen = asyncio.Event()
        self.refusals_noted: dict[tuple[str, str], None] = {}  # attempts whose first refused event is stored
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        self.coordinator.start()
        self._tasks.append(asyncio.create_task(self._follow_models()))
        if self.engine_check is not None:
            self._tasks.append(asyncio.create_task(self.engine_check.run()))
        waits = [asyncio.ensure_future(e.wait()) for e in (self._models_seen, self.coordinator.synced)]
        _, pending = await asyncio.wait(waits, timeout=_STARTUP_SYNC_S)
        for task in pending:
            task.cancel()
        if pending:
            log.warning("ledger at %s not synced after %.0fs; serving anyway", self.config.ledger, _STARTUP_SYNC_S)
        # What startup built (modules, descriptors, the app) lives for good: keep it out of the collector's scans,
        # and collect the young generation less often (a call allocates a few hundred containers).
        gc.freeze()
        gc.set_threshold(10_000, 10, 10)
        log.info(
            "proxy replica %s serving model %s (%d endpoint(s)), ledger %s, auth %s",
            self.coordinator.replica_id,
            self.config.model_name,
            len(self.routing.table().endpoints),
            self.config.ledger,
            "on" if self.auth.enabled else "off",
        )

    def _routing_changed(self) -> None:
        endpoints, stale, held = self.routing.count()
        self.metrics.endpoints.set(endpoints)
        self.metrics.stale_endpoints.set(stale)
        self.metrics.held_endpoints.set(held)

    async def _follow_models(self) -> None:
        failures = 0

        def changed() -> None:
            nonlocal failures
            failures = 0
            self._routing_changed()
            if self.engine_check is not None:  # a push re-registered an engine, or a new one came: read it now
                self.engine_check.poke()
            self.readiness.models_seen = True
            self.readiness.succeeded()
            self._models_seen.set()

        while True:
            try:
                await self.gateway.follow_models(self.routing, changed)
            except LedgerError as err:  # a status the client does not resume (e.g. a refused key)
                self.routing.lost()
                failures += 1
                self.readiness.failed(err)
                await asyncio.sleep(backoff_s(failures))
            except Exception:
                self.routing.lost()
                failures += 1
                log.exception("models stream failed; retrying")
                await asyncio.sleep(backoff_s(failures))

    async def stop(self) -> None:
        await stop_tasks(self._tasks)
        await self.coordinator.stop()
        await self.upstream.close()
        await self.client.close()


def runtime_of(request: Request) -> ProxyRuntime:
    """The runtime of the app serving this request (create_app puts it on the app's state)."""
    runtime: ProxyRuntime = request.app.state.runtime
    return runtime
