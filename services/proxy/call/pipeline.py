"""One model call, end to end: check, rewrite, forward (with retries), capture, record, answer.

The model_request event is appended and acknowledged before the agent gets the answer (for streams: before the
final [DONE]), so a reward posted afterwards is always ordered after the calls it rewards. If it cannot be
recorded the agent gets an error instead of the answer: a call is never silently unrecorded.

The steps of one call (retries, capture, the event being built, the answer) share that call's state from check to
answer, streamed and not.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import httpx
import orjson
from prometheus_client import Counter, Histogram

from services.proxy.call.capture import Capture, StreamAssembler, capture_response
from services.proxy.call.continuation import Continued, TokenContinuation, stream_chunks
from services.proxy.call.free_sampling import free_sampling
from services.proxy.call.max_tokens_fit import ContextLengths, fit, granted, requested_limit
from services.proxy.call.recording import ERROR, INCOMPLETE, OK, CallRecord, model_request_event
from services.proxy.call.request_limits import RequestLimits
from services.proxy.call.rewrite import CHAT, RewriteSettings, dumps, loads_lenient, parse_body, rewrite, validate
from services.proxy.call.sse import DONE, SSESplitter
from services.proxy.call.tool_calls import missing_parser_message, offered_tool_names, tool_call_stats
from services.proxy.dialects.responses_chain import find
from services.proxy.dialects.translation import Dialect, StreamTranslator
from services.proxy.engines.model_tables import ROLE_POLICY, ModelRoutes, requested_model
from services.proxy.engines.routing import Endpoint
from services.proxy.engines.upstream import Upstream, UpstreamResult, close_response
from services.proxy.engines.weight_check import not_current_error
from services.proxy.errors import ProxyError
from services.proxy.fleet.coordination import Coordinator
from services.proxy.fleet.ledger_gateway import LedgerGateway
from services.proxy.metrics import ProxyMetrics

log = logging.getLogger(__name__)

API_PATHS = {CHAT: "/chat/completions", "completions": "/completions"}
_STATUS_NAMES = {OK: "ok", ERROR: "error", INCOMPLETE: "incomplete"}


@dataclass
class Reply:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=lambda: {"content-type": "application/json"})


@dataclass
class _Call:
    rollout_id: str
    attempt_id: str
    api: str
    request_json: str
    started: float
    stream: bool
    # Names of the tools the request offered (None: none), for the event's tool-call counts.
    offered_tools: frozenset[str] | None = None
    # A train chat call: its tokens are remembered, so that the rollout's next turn can continue them.
    continued: bool = False
    # The model it is routed to: its rollout's label, else the proxy's own, or the policy its role map names.
    model: str = ""
    # The model name the agent's request sent, and whose call it is by the rollout's role map (ModelRequestRole).
    requested_model: str = ""
    role: int = 0
    # What the proxy left out of or changed in the agent's request, one sentence each.
    warnings: tuple[str, ...] = ()
    # The output-token limit the agent's request set (None: none) and the engine's context length (0: unknown).
    limit: int | None = None
    max_model_len: int = 0

    @property
    def key(self) -> tuple[str, str]:
        return (self.rollout_id, self.attempt_id)


# While a call waits for an engine: how often the routing is looked at, and the pause before a call that found
# no engine listening goes again (the checker needs a moment to hold the dead one back).
_WAIT_POLL_S = 0.1
_REROUTE_PAUSE_S = 0.25
# How long a call waits for the model registry to be read again after its stream was cut (a ledger restart). The
# stream is re-opened at most 2 s apart, so this covers several tries; a ledger still away gets the call a 503.
_REGISTRY_WAIT_S = 10.0


def _unreachable(result: UpstreamResult) -> bool:
    return result.error is not None and result.error.kind == "upstream_unreachable"


class ModelCalls:
    def __init__(
        self,
        settings: RewriteSettings,
        gateway: LedgerGateway,
        coordinator: Coordinator,
        routing: ModelRoutes,
        upstream: Upstream,
        metrics: ProxyMetrics,
        continuation: TokenContinuation | None = None,
        limits: RequestLimits | None = None,
        engine_wait_s: float = 0.0,
    ) -> None:
        self.settings = settings
        # How long a call waits for an engine when every one is held back or unreachable (a restart).
        self.engine_wait_s = engine_wait_s
        self.limits = limits or RequestLimits()
        self.continuation = continuation
        self.gateway = gateway
        self.coordinator = coordinator
        self.routing = routing
        self.upstream = upstream
        self.metrics = metrics
        # Labelled metric children by (api, status): labels() takes a lock and validates names on every call.
        self._call_metrics: dict[tuple[str, int], tuple[Counter, Histogram]] = {}
        # Event ids of the calls' records: unique per process and cheaper than a uuid4 (an urandom read) each.
        self._id_prefix = uuid.uuid4().hex
        self._id_counter = itertools.count()
        # Told when a call found an engine unreachable (the engine checker reads the labels again at once).
        self.on_unreachable: Callable[[], None] | None = None
        self.context_lengths = ContextLengths(upstream.client)

    async def handle(
        self, rollout_id: str, attempt_id: str, mode: str, api: str, raw: bytes, dialect: Dialect | None = None
    ) -> Reply | StreamSession:
        """One call of `api`; with a dialect, `api` is the agent's API, translated to and from chat completions."""
        body = agent_body = parse_body(raw)
        self.limits.check(body, api)  # in the agent's own fields, before anything is sent
        engine_api = api
        if dialect is None:
            validate(body, api)
        else:
            body, engine_api = dialect.to_chat(body), CHAT
            earlier = dialect.earlier(agent_body) if dialect.earlier is not None else ""
            if earlier and dialect.chain is not None:  # the earlier response's conversation, from the ledger
                calls = await self.gateway.calls_of(rollout_id, attempt_id)
                body = dialect.chain(find(calls, earlier, rollout_id, "previous_response_id"), body, agent_body)
            validate(body, CHAT)
        warnings = tuple(dialect.warnings(agent_body)) if dialect is not None and dialect.warnings else ()
        self.coordinator.enter()
        handed_over = False
        entered: str | None = None  # the model whose count the call is in
        try:
            model, role, requested = await self._route(rollout_id, attempt_id, api, body, agent_body)
            self.coordinator.enter_model(model)
            entered = model
            if not self.routing.current:
                await self._registry_read(rollout_id)
            table = self.routing.table(model)
            endpoints = table.ranked(rollout_id)
            if not endpoints and not table.endpoints:
                raise ProxyError("no_endpoint", f"No engine endpoint is registered for model {model}.")
            upstream_body = rewrite(body, engine_api, mode, self.settings, model)
            if mode == "train":  # nothing the agent asks for changes what a train call samples from
                upstream_body, dropped = free_sampling(upstream_body)
                warnings = (*warnings, *dropped)
            request_bytes = dumps(upstream_body, "The request body")
            stream = bool(upstream_body.get("stream"))
            call = _Call(
                rollout_id, attempt_id, api, request_bytes.decode(), time.perf_counter(), stream,
                offered_tool_names(upstream_body),
                continued=self.continuation is not None and mode == "train" and engine_api == CHAT
                and upstream_body.get("n") in (None, 1) and role == ROLE_POLICY,
                model=model, requested_model=requested, role=role, warnings=warnings,
                limit=requested_limit(upstream_body),
            )  # fmt: skip
            for warning in warnings:
                log.info("rollout %s: %s call: %s", rollout_id, api, warning)
            deadline = call.started + self.engine_wait_s
            if not endpoints:
                endpoints = await self._routable(call, deadline)
            if call.limit is not None:
                request_bytes = await self._fit(call, endpoints[0], upstream_body, request_bytes)
            if call.continued:
                assert self.continuation is not None
                spliced = await self.continuation.answer(call.key, endpoints[0], upstream_body)
                if spliced is not None:
                    return await self._spliced_reply(call, endpoints[0], spliced, upstream_body, dialect, agent_body)
            result = await self.upstream.call(
                endpoints, API_PATHS[engine_api], request_bytes, stream=stream, rollout_id=rollout_id
            )
            # No engine took the connection (nothing was generated): within the wait, the call goes again once one
            # is routable; the checker holds the dead one back meanwhile.
            while _unreachable(result) and time.perf_counter() < deadline and not self.coordinator.paused_for(model):
                if self.on_unreachable is not None:
                    self.on_unreachable()
                await asyncio.sleep(_REROUTE_PAUSE_S)
                endpoints = await self._routable(call, deadline)
                result = await self.upstream.call(
                    endpoints, API_PATHS[engine_api], request_bytes, stream=stream, rollout_id=rollout_id
                )
            if result.retries:
                self.metrics.upstream_retries.inc(result.retries)
            if result.error is not None:
                error = result.error
                if _unreachable(result) and self.on_unreachable is not None:
                    self.on_unreachable()
                await self.record(call, result.endpoint, result.retries, error.status, json.dumps(error.body()), ERROR)
                raise error
            response = result.response
            assert response is not None
            if stream and response.status_code < 300:
                handed_over = True
                translator = None if dialect is None else dialect.stream(agent_body)
                return StreamSession(self, call, response, result.endpoint, result.retries, translator)
            content = response.content
            capture, status = Capture(model=model), ERROR
            if response.status_code < 300:
                try:
                    capture, status = capture_response(loads_lenient(content), engine_api), OK
                except ValueError:
                    log.warning("rollout %s: engine answered %d with a body that is not JSON", rollout_id, 200)
            await self.record(
                call,
                result.endpoint,
                result.retries,
                response.status_code,
                content.decode("utf-8", "replace"),
                status,
                capture,
            )
            if status == OK:
                self.remember(call, capture)
            hint = missing_parser_message(response.status_code, content) if call.offered_tools is not None else None
            if hint is not None:
                raise ProxyError("engine_has_no_tool_parser", hint)
            if dialect is not None:
                return _translated_reply(dialect, agent_body, response.status_code, content, status)
            headers = {"content-type": response.headers.get("content-type", "application/json")}
            return Reply(response.status_code, content, headers)
        finally:
            if not handed_over:
                self.coordinator.leave(entered)

    async def _route(
        self, rollout_id: str, attempt_id: str, api: str, body: dict, agent_body: dict
    ) -> tuple[str, int, str]:
        """The model the call goes to, its role and the model name the agent sent, by the rollout's labels. A name
        its role map refuses (or a map that cannot be read) is recorded as a failed call, then answered."""
        models = await self.gateway.check_rollout(rollout_id, attempt_id)
        own = models.model or self.settings.model_name
        requested = requested_model(agent_body)
        try:
            model, role = models.route(requested, own)
        except ProxyError as err:
            call = _Call(rollout_id, attempt_id, api, dumps(body, "The request body").decode(), time.perf_counter(),
                         bool(body.get("stream")), model=own, requested_model=requested)  # fmt: skip
            await self.record(call, Endpoint(""), 0, err.status, json.dumps(err.body()), ERROR)
            raise
        return model, role, requested

    async def _registry_read(self, rollout_id: str) -> None:
        """Returns once the routing tables are the registry as it is now (ModelRoutes.current), or raises a 503
        after _REGISTRY_WAIT_S: a call is never routed, nor recorded, at a version the registry may have left."""
        deadline = time.perf_counter() + _REGISTRY_WAIT_S
        while not self.routing.current:
            if time.perf_counter() >= deadline:
                raise ProxyError(
                    "ledger_unavailable",
                    f"The proxy has not read the model registry again within {_REGISTRY_WAIT_S:g}s of losing its "
                    "stream from the ledger; the call was not sent.",
                    headers={"Retry-After": "2"},
                )
            await asyncio.sleep(_WAIT_POLL_S)
        log.info("rollout %s: call waited for the model registry to be read again", rollout_id)

    async def _fit(self, call: _Call, endpoint: Endpoint, upstream_body: dict, request_bytes: bytes) -> bytes:
        """The request to send once its output limit fits the engine's context (call/max_tokens_fit.py)."""
        call.max_model_len = await self.context_lengths.of(endpoint, call.model) or 0
        if not fit(upstream_body, call.max_model_len):
            return request_bytes
        log.info("rollout %s: %s call asks for %d output tokens; the engine holds %d positions: sent with %d",
                 call.rollout_id, call.api, call.limit, call.max_model_len, call.max_model_len)  # fmt: skip
        request_bytes = dumps(upstream_body, "The request body")
        call.request_json = request_bytes.decode()
        return request_bytes

    async def _routable(self, call: _Call, deadline: float) -> list[Endpoint]:
        """The call's ranking once an engine is routable, waiting until `deadline` (or a pause) at most; then a
        recorded 503 `engine_not_current` (so the rollout shows why its agent failed)."""
        while True:
            table = self.routing.table(call.model)
            endpoints = table.ranked(call.rollout_id)
            if endpoints:
                return endpoints
            if time.perf_counter() >= deadline or self.coordinator.paused_for(call.model):
                break
            await asyncio.sleep(_WAIT_POLL_S)
        error = not_current_error(call.model, table.held)
        await self.record(call, Endpoint(""), 0, error.status, json.dumps(error.body()), ERROR)
        raise error

    def remember(self, call: _Call, capture: Capture, prompt_hidden: tuple[int, ...] = ()) -> None:
        if call.continued and self.continuation is not None:
            self.continuation.remember(call.key, capture, prompt_hidden)

    async def _spliced_reply(
        self,
        call: _Call,
        endpoint: Endpoint,
        continued: Continued,
        upstream_body: dict,
        dialect: Dialect | None,
        agent_body: dict,
    ) -> Reply:
        """The answer to a call the engine generated from a spliced prompt: recorded, then sent (as a stream of
        its chunks when the agent asked for one)."""
        response = continued.response
        content = orjson.dumps(response)
        capture = capture_response(response, CHAT)
        await self.record(call, endpoint, 0, 200, content.decode(), OK, capture)
        self.remember(call, capture, continued.hidden)
        if not call.stream:
            if dialect is not None:
                return _translated_reply(dialect, agent_body, 200, content, OK)
            return Reply(200, content)
        options = upstream_body.get("stream_options") or {}
        chunks = stream_chunks(response, bool(options.get("include_usage")))
        if dialect is None:
            body = b"".join(b"data: " + orjson.dumps(chunk) + b"\n\n" for chunk in chunks) + b"data: [DONE]\n\n"
        else:
            translator = dialect.stream(agent_body)
            body = b"".join(translator.feed(chunk) for chunk in chunks) + translator.finish(response)
        return Reply(200, body, {"content-type": "text/event-stream"})

    async def record(
        self,
        call: _Call,
        endpoint: Endpoint,
        retries: int,
        http_status: int,
        response_json: str,
        status: int,
        capture: Capture | None = None,
    ) -> None:
        latency = time.perf_counter() - call.started
        requested = granted_tokens = 0
        if call.limit is not None and call.max_model_len:
            prompt = 0
            if capture is not None and status == OK:
                prompt = len(capture.prompt_token_ids) or (capture.usage or {}).get("prompt_tokens", 0)
            room = granted(call.max_model_len, prompt) if prompt else 0
            if call.limit > call.max_model_len or (prompt and call.limit > room):
                requested, granted_tokens = call.limit, room
        record = CallRecord(
            rollout_id=call.rollout_id,
            attempt_id=call.attempt_id,
            api=call.api,
            stream=call.stream,
            request_json=call.request_json,
            response_json=response_json,
            capture=capture or Capture(model=call.model or self.settings.model_name),
            endpoint=endpoint.url,
            model_version=endpoint.version,
            latency_s=latency,
            http_status=http_status,
            retry_count=retries,
            status=status,
            tool_calls=(
                tool_call_stats(call.offered_tools, capture.content, capture.tool_calls)
                if capture is not None and status == OK
                else None
            ),
            warnings=call.warnings,
            requested_max_tokens=requested,
            granted_max_tokens=granted_tokens,
            requested_model=call.requested_model,
            role=call.role,
        )
        started = time.perf_counter()
        event = model_request_event(record)
        event.event_id = f"{self._id_prefix}-{next(self._id_counter)}"
        await self.gateway.append(event)
        self.metrics.ledger_append_seconds.observe(time.perf_counter() - started)
        counted = self._call_metrics.get((call.api, status))
        if counted is None:
            counted = self._call_metrics[call.api, status] = (
                self.metrics.calls.labels(call.api, _STATUS_NAMES[status]),
                self.metrics.call_seconds.labels(call.api),
            )
        counted[0].inc()
        counted[1].observe(latency)
        if status != OK:
            log.info(
                "rollout %s: %s call recorded as %s (HTTP %d, %d retries)",
                call.rollout_id,
                call.api,
                _STATUS_NAMES[status],
                http_status,
                retries,
            )


def _translated_reply(dialect: Dialect, request: dict, http_status: int, content: bytes, status: int) -> Reply:
    """The agent API's answer for the engine's chat answer (already recorded)."""
    if status == OK:
        return Reply(http_status, orjson.dumps(dialect.from_chat(loads_lenient(content), request)))
    if http_status < 300:
        raise ProxyError("upstream_unreachable", "The engine answered with a body that is not JSON.")
    try:
        body = loads_lenient(content)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        body = {
            "error": {"message": content.decode("utf-8", "replace")[:2000] or f"The engine answered {http_status}."}
        }
    return Reply(http_status, orjson.dumps(dialect.error_body(body, http_status)))


def _sse_error(err: ProxyError) -> bytes:
    return b"data: " + json.dumps(err.body()).encode() + b"\n\n"


class StreamSession:
    """Forwards an engine's SSE stream as it arrives, assembles it, and records it before the final [DONE].

    `run` is driven by the transport with a `send` for body bytes; when the agent goes away the transport
    cancels `run`, which then records what it had with status INCOMPLETE.
    """

    def __init__(
        self,
        calls: ModelCalls,
        call: _Call,
        response: httpx.Response,
        endpoint: Endpoint,
        retries: int,
        translator: StreamTranslator | None = None,
    ):
        self._calls = calls
        self._call = call
        self._response = response
        self._endpoint = endpoint
        self._retries = retries
        # With a translator the engine's chat chunks reach the agent translated into its own API's events.
        self._translator = translator
        self.assembler = StreamAssembler(CHAT if translator is not None else call.api)

    async def run(self, send: Callable[[bytes], Awaitable[None]]) -> None:
        splitter = SSESplitter()
        done = False
        failure: str | None = None
        recording: asyncio.Future[None] | None = None
        kind = self._response.headers.get("content-type", "")
        # Not an event stream (an engine that ignored `stream`): its body is what the event records.
        other: list[bytes] | None = None if kind.startswith("text/event-stream") else []
        translator = self._translator
        try:
            try:
                # aiter_bytes, not aiter_raw: an answer with a Content-Length (not a stream after all) comes from
                # the pool already read, and only aiter_bytes serves read content.
                async for raw in self._response.aiter_bytes():
                    if other is not None:
                        other.append(raw)
                    out = []
                    for event in splitter.feed(raw):
                        if event.data == DONE:
                            done = True
                            continue
                        chunk = self._feed(event.data) if event.data else None
                        if translator is None:
                            out.append(event.raw)
                        elif chunk is not None:
                            out.append(translator.feed(chunk))
                    if out:
                        await send(b"".join(out))
            except httpx.HTTPError as err:
                failure = f"{type(err).__name__}: {err}"
            if failure is None and not done:
                failure = (
                    "the stream ended without [DONE]"
                    if other is None
                    else f"the engine answered with {kind or 'no content type'}, not an event stream"
                )
            await close_response(self._response)
            body = None if other is None else b"".join(other).decode("utf-8", "replace")
            # Shielded: an agent leaving now must not cut an append that may already have reached the ledger.
            recording = asyncio.ensure_future(self._record(OK if failure is None else ERROR, body))
            await asyncio.shield(recording)
        except asyncio.CancelledError:
            await self._after_disconnect(recording)
            return
        except ProxyError as err:
            await send(_sse_error(err) if translator is None else translator.error(err))
            return
        finally:
            await close_response(self._response)
            self._calls.coordinator.leave(self._call.model)
        if failure is not None:
            log.warning("rollout %s: engine stream failed: %s", self._call.rollout_id, failure)
            err = ProxyError("upstream_unreachable", f"The engine stream failed: {failure}")
            await send(_sse_error(err) if translator is None else translator.error(err))
            return
        await send(b"data: [DONE]\n\n" if translator is None else translator.finish(self.assembler.response()))

    async def _after_disconnect(self, recording: asyncio.Future[None] | None) -> None:
        """The agent went away: record what was assembled as incomplete (or let a started record finish)."""
        try:
            if recording is not None:
                await recording
                return
            await close_response(self._response)
            await self._record(INCOMPLETE)
        except ProxyError as err:
            log.warning("rollout %s: could not record an interrupted stream: %s", self._call.rollout_id, err.message)

    def _feed(self, data: bytes) -> dict | None:
        try:
            chunk = loads_lenient(data)
        except ValueError:
            return None
        if isinstance(chunk, dict):
            self.assembler.feed(chunk)
            return chunk
        return None

    async def _record(self, status: int, body: str | None = None) -> None:
        """Records the call: with the assembled stream as its response, or with `body` when given."""
        response_json = orjson.dumps(self.assembler.response()).decode() if body is None else body
        capture = self.assembler.capture()
        await self._calls.record(
            self._call,
            self._endpoint,
            self._retries,
            self._response.status_code,
            response_json,
            status,
            capture,
        )
        if status == OK:
            self._calls.remember(self._call, capture)
