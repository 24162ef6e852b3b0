"""The proxy's HTTP transport: a Starlette app wiring routes to the core, and the one place errors become HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import grpc
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from services import http_serving as serving
from services.client import LedgerClient, backoff_s
from services.printable import printable

from . import anthropic_messages, openai_responses
from .auth import Authorizer, presented_key
from .background import stop_tasks
from .calls import ModelCalls, Reply, StreamSession
from .client_limits import limits_for
from .config import ProxyConfig, parse_config
from .continuation import TokenHistory
from .coordination import Coordinator
from .engine_check import EngineChecker
from .errors import ProxyError
from .event_checks import check_agent_event
from .gateway import V1_ATTEMPT, LedgerGateway
from .metrics import ProxyMetrics
from .readiness import Readiness
from .recording import agent_event, refused_event
from .rest_routes import RestFacade
from .retry import RetryPolicy
from .rewrite import CHAT, COMPLETIONS, MODES, RewriteSettings, parse_body
from .routing import RoutingTable
from .token_continuation import TokenContinuation
from .translation import Dialect
from .upstream import Upstream

log = logging.getLogger(__name__)

_PREFIX = "/proxy/rollout/{rollout_id}/attempt/{attempt_id}/mode/{mode}/openai/v1"
_STARTUP_SYNC_S = 3.0
# The longest Retry-After a pause may tell agents (a day); the ledger keeps it as a 32-bit number.
_MAX_RETRY_AFTER_S = 86_400


class ProxyStream(Response):
    """Streams a StreamSession to the agent while watching for the agent to disconnect."""

    def __init__(self, session: StreamSession) -> None:
        self.session = session
        self.status_code = 200
        self.background = None
        self.init_headers({"cache-control": "no-cache", "x-accel-buffering": "no"})
        self.raw_headers.append((b"content-type", b"text/event-stream; charset=utf-8"))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_body(data: bytes) -> None:
            await send({"type": "http.response.body", "body": data, "more_body": True})

        pump = asyncio.ensure_future(self._pump(send, send_body))
        listener = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait((pump, listener), return_when=asyncio.FIRST_COMPLETED)
            if not pump.done():
                pump.cancel()
                await asyncio.wait((pump,))
        finally:
            listener.cancel()
        if not pump.cancelled() and pump.exception() is not None:
            log.error("stream of rollout %s failed", self.session._call.rollout_id, exc_info=pump.exception())
        with contextlib.suppress(OSError):
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _pump(self, send: Send, send_body: Any) -> None:
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        finally:
            await self.session.run(send_body)


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class Proxy:
    """The parts of one proxy process, built at startup."""

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
        self.routing = RoutingTable(config.model_name)
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
            len(self.routing.endpoints),
            self.config.ledger,
            "on" if self.auth.enabled else "off",
        )

    def _routing_changed(self) -> None:
        self.metrics.endpoints.set(len(self.routing.endpoints))
        self.metrics.stale_endpoints.set(len(self.routing.stale))
        self.metrics.held_endpoints.set(len(self.routing.held))

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
            except grpc.aio.AioRpcError as err:  # a status the client does not resume (e.g. a refused key)
                failures += 1
                self.readiness.failed(err)
                await asyncio.sleep(backoff_s(failures))
            except Exception:
                failures += 1
                log.exception("models stream failed; retrying")
                await asyncio.sleep(backoff_s(failures))

    async def stop(self) -> None:
        await stop_tasks(self._tasks)
        await self.coordinator.stop()
        await self.upstream.close()
        await self.client.close()


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ProxyError("body_too_large", f"The body is larger than the limit of {limit} bytes.")
    # Straight from the ASGI messages rather than through request.stream(): an async generator per call costs
    # more than this loop, and the whole body usually comes in one message.
    chunks = []
    size = 0
    receive = request.receive
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise ProxyError("body_too_large", f"The body is larger than the limit of {limit} bytes.")
        if not message.get("more_body", False):
            return b"".join([*chunks, chunk]) if chunks else chunk
        chunks.append(chunk)


def _error_response(err: ProxyError) -> Response:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def create_app(config: ProxyConfig) -> Starlette:
    proxy = Proxy(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await proxy.start()
        try:
            yield
        finally:
            await proxy.stop()

    async def scope_ids(request: Request) -> tuple[str, str]:
        """The rollout and attempt of an agent route, the caller allowed on them. With the master key, v1.0's
        constant attempt "0" names the rollout's attempt (gateway.v1_attempt); an agent token names only its own."""
        params = request.path_params
        rollout_id, attempt_id = params["rollout_id"], params["attempt_id"]
        presented = presented_key(request.headers)
        proxy.auth.require_rollout(presented, rollout_id, attempt_id)
        serving.trust_connection(request.scope)
        if attempt_id == V1_ATTEMPT and proxy.auth.is_master(presented):
            attempt_id = await proxy.gateway.v1_attempt(rollout_id)
        return rollout_id, attempt_id

    async def model_call(request: Request, api: str, dialect: Dialect | None = None) -> Response:
        rollout_id, attempt_id = await scope_ids(request)
        mode = request.path_params["mode"]
        if mode not in MODES:
            raise ProxyError("not_found", f"Unknown mode {mode!r}: use train or val.")
        raw = await _read_body(request, config.max_body_bytes)
        outcome = await proxy.calls.handle(rollout_id, attempt_id, mode, api, raw, dialect)
        if isinstance(outcome, Reply):
            return Response(outcome.body, status_code=outcome.status, headers=outcome.headers)
        return ProxyStream(outcome)

    async def chat(request: Request) -> Response:
        return await model_call(request, CHAT)

    async def completions(request: Request) -> Response:
        return await model_call(request, COMPLETIONS)

    async def translated_call(request: Request, dialect: Dialect) -> Response:
        """A call in another agent API: every error is answered in that API's own error shape."""
        try:
            return await model_call(request, dialect.api, dialect)
        except ProxyError as err:
            note_error(request, err)
            body = dialect.error_body(err.body(), err.status)
            return JSONResponse(body, status_code=err.status, headers=err.headers)

    async def messages(request: Request) -> Response:
        return await translated_call(request, anthropic_messages.DIALECT)

    async def responses(request: Request) -> Response:
        return await translated_call(request, openai_responses.DIALECT)

    async def models(request: Request) -> Response:
        await scope_ids(request)
        card = {"id": config.model_name, "object": "model", "created": 0, "owned_by": "agl"}
        return JSONResponse({"object": "list", "data": [card]})

    async def events(request: Request) -> Response:
        rollout_id, attempt_id = await scope_ids(request)
        master = proxy.auth.is_master(presented_key(request.headers))
        body = parse_body(await _read_body(request, config.max_body_bytes), lenient=True)
        try:
            check_agent_event(body)
            event = agent_event(rollout_id, attempt_id, body, master=master)
        except ProxyError as err:
            await note_refusal(rollout_id, attempt_id, err, body)
            raise
        sequence, filed_under = await proxy.gateway.append_filed(event)
        proxy.metrics.events.labels(proxy.metrics.event_type_label(event.event_type)).inc()
        # v1.0 answered with the stored Event (its clients validate `timestamp` and `data`); the time is the
        # proxy's at the acknowledgement, within a millisecond of the ledger's own stamp. An event filed under no
        # attempt (v1.0's "0" on a rollout never claimed) is v1.0's attempt "0".
        answer = {"rollout_id": rollout_id, "attempt_id": filed_under or V1_ATTEMPT, "event_type": event.event_type}
        answer.update(sequence=sequence, timestamp=time.time(), data=body.get("data", {}))
        try:
            return JSONResponse(answer)
        except ValueError:  # data with NaN or Infinity (stored as given): not echoed
            answer["data"] = {}
            return JSONResponse(answer)

    async def note_refusal(rollout_id: str, attempt_id: str, err: ProxyError, body: Any) -> None:
        """The first refused event of an attempt is stored on the rollout as a warning (best effort)."""
        log.info(
            "rollout %s attempt %s: event refused (%d %s): %s",
            rollout_id,
            attempt_id,
            err.status,
            err.kind,
            printable(str(err)),
        )
        if (rollout_id, attempt_id) in proxy.refusals_noted:
            return
        proxy.refusals_noted[(rollout_id, attempt_id)] = None
        while len(proxy.refusals_noted) > 10_000:
            proxy.refusals_noted.pop(next(iter(proxy.refusals_noted)))
        posted = body.get("event_type") if isinstance(body, dict) else None
        with contextlib.suppress(ProxyError):  # the rollout finished or the ledger is away: the 422 still answers
            await proxy.gateway.append(refused_event(rollout_id, attempt_id, err, posted))

    async def healthz(request: Request) -> Response:
        """Alive: exactly v1.0's body (clients compare it); what this replica knows is on /status."""
        return JSONResponse({"status": "ok"})

    async def replica_status(request: Request) -> Response:
        status = {"status": "ok", "replica_id": proxy.coordinator.replica_id, "model": config.model_name}
        status.update(endpoints=[e.url for e in proxy.routing.endpoints], paused=proxy.coordinator.paused)
        status["in_flight"] = proxy.coordinator.in_flight
        # The endpoints not routed to, and why: below the model's highest version, or held by their engine's state.
        newest = max((e.version for e in proxy.routing.endpoints), default=0)
        held = {e.url: f"registered at version {e.version}, below the model's {newest}" for e in proxy.routing.stale}
        status["held_back"] = {**held, **proxy.routing.held}
        return JSONResponse(status)

    async def readyz(request: Request) -> Response:
        """200 while the ledger answers the proxy's key and the model registry has been seen, else 503 with why."""
        status = proxy.readiness.describe()
        status["endpoints"] = len(proxy.routing.endpoints)
        return JSONResponse(status, status_code=200 if proxy.readiness.ready else 503)

    async def metrics(request: Request) -> Response:
        proxy.metrics.set_counts(proxy.upstream.pool.opened, proxy.gateway.append_requests)
        return Response(generate_latest(proxy.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def admin_body(request: Request) -> dict[str, Any]:
        proxy.auth.require_master(presented_key(request.headers))
        serving.trust_connection(request.scope)
        raw = await _read_body(request, 64 * 1024)
        return parse_body(raw) if raw.strip() else {}

    def _int(body: dict[str, Any], name: str, default: int, most: int) -> int:
        value = body.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= most:
            raise ProxyError("invalid_request", f"`{name}` must be a number between 0 and {most}.")
        return int(value)

    def _owner_lease(body: dict[str, Any]) -> tuple[str, float]:
        """The optional `owner` and `lease_seconds` of a pause (the ledger checks they go together)."""
        owner = body.get("owner", "")
        if not isinstance(owner, str) or len(owner) > 200:
            raise ProxyError("invalid_request", "`owner` must be a string of at most 200 characters.")
        lease = body.get("lease_seconds", 0)
        if isinstance(lease, bool) or not isinstance(lease, int | float) or not 0 <= lease <= 86_400:
            raise ProxyError("invalid_request", "`lease_seconds` must be a number between 0 and 86400.")
        return owner, float(lease)

    async def pause(request: Request) -> Response:
        body = await admin_body(request)
        retry_after = _int(body, "retry_after_seconds", 5, _MAX_RETRY_AFTER_S)
        owner, lease = _owner_lease(body)
        return JSONResponse(await proxy.coordinator.pause(retry_after, str(body.get("reason", "")), owner, lease))

    async def resume(request: Request) -> Response:
        await admin_body(request)
        return JSONResponse(await proxy.coordinator.resume())

    async def state(request: Request) -> Response:
        await admin_body(request)
        return JSONResponse(await proxy.coordinator.state())

    async def drain(request: Request) -> Response:
        body = await admin_body(request)
        timeout = body.get("timeout_seconds", 60)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout < 0:
            raise ProxyError("invalid_request", "`timeout_seconds` must be a non-negative number.")
        owner, lease = _owner_lease(body)
        result = await proxy.coordinator.drain(
            float(timeout),
            _int(body, "retry_after_seconds", 5, _MAX_RETRY_AFTER_S),
            str(body.get("reason", "")),
            owner,
            lease,
        )
        return JSONResponse(result)

    def note_error(request: Request, exc: ProxyError) -> None:
        proxy.metrics.rejected.labels(exc.kind).inc()
        if exc.status >= 500:
            path, message = printable(request.url.path), printable(exc.message)
            log.warning("%s %s -> %d %s", request.method, path, exc.status, message)

    async def proxy_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ProxyError)
        note_error(request, exc)
        return _error_response(exc)

    def shaped(request: Request, err: ProxyError, status: int) -> Response:
        """An error answer in the shape of the API the path belongs to (Anthropic's under .../messages)."""
        body = err.body()
        if "/messages" in request.url.path:
            body = anthropic_messages.error_body(body, status)
        return JSONResponse(body, status_code=status)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        kind = "not_found" if exc.status_code in (404, 405) else "invalid_request"
        return shaped(request, ProxyError(kind, f"{request.method} {request.url.path}: {exc.detail}"), exc.status_code)

    async def client_left(request: Request, exc: Exception) -> Response:
        """The agent left (or its body deadline passed, answered 408 by the server) before its request was in:
        nobody to answer and no bug, so one line naming the rollout instead of a traceback."""
        params = request.path_params
        rollout_id, attempt_id = params.get("rollout_id"), params.get("attempt_id", "-")
        where = f"rollout {printable(rollout_id)} attempt {printable(attempt_id)}" if rollout_id else "no rollout"
        log.info(
            "%s: %s %s: the agent left before its request arrived (or its body deadline passed)",
            where,
            request.method,
            printable(request.url.path),
        )
        return Response(status_code=400)

    async def internal_error(request: Request, exc: Exception) -> Response:
        # A bug, not the agent's fault: answered OpenAI-shaped, never with a traceback (Starlette re-raises it after
        # this answer, and uvicorn logs it with its traceback).
        err = ProxyError("internal", "The proxy failed to handle this request; see its log.")
        return shaped(request, err, err.status)

    routes = [
        Route(f"{_PREFIX}/chat/completions", chat, methods=["POST"]),
        Route(f"{_PREFIX}/completions", completions, methods=["POST"]),
        Route(f"{_PREFIX}/models", models, methods=["GET"]),
        Route(f"{_PREFIX}/messages", messages, methods=["POST"]),
        Route(f"{_PREFIX}/responses", responses, methods=["POST"]),
        Route("/api/rollouts/{rollout_id}/attempt/{attempt_id}/events", events, methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/status", replica_status, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/admin/pause", pause, methods=["POST"]),
        Route("/admin/resume", resume, methods=["POST"]),
        Route("/admin/state", state, methods=["GET"]),
        Route("/admin/drain", drain, methods=["POST"]),
        # Agent Lightning v1.0's store routes (/api/rollouts..., /api/models) over the ledger's gRPC, and its
        # gateway management routes (/proxy/pause, /proxy/resume, /proxy/state) over the coordinator.
        *RestFacade(proxy.client, proxy.auth, proxy.coordinator).routes(),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={
            ProxyError: proxy_error,
            HTTPException: http_error,
            ClientDisconnect: client_left,
            Exception: internal_error,
        },
    )
    app.state.proxy = proxy
    return app


def app_from_argv() -> Starlette:
    """Factory for uvicorn workers: each worker process rebuilds the config from the same flags and env."""
    config = parse_config()
    serving.configure(limits_for(config))  # the protocol of this worker serves with the same client limits
    return create_app(config)
