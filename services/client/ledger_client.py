"""LedgerClient: typed helpers over the generated LedgerService stub.

Every failed call raises one of the typed errors of errors.py (mapped from the gRPC status where it enters the
client). Unary calls are retried on UNAVAILABLE with capped, jittered exponential backoff: the one retry policy
of the client's unary calls (`RetryPolicy`; long-running workers pass `THROUGH_RESTARTS`). Retrying is safe because
the client fills in caller-chosen ids (rollout ids, event ids) before the first try, so a retry after a lost
response finds the stored item instead of creating a second one. Watches reconnect by themselves and resume
from the last revision or cursor they delivered.

Concurrent `append_events` calls are coalesced into shared AppendEvents requests (see append_batcher); each
caller still gets its own answer or its own error. The requests travel over one long-lived StreamAppendEvents
call (see append_stream), which costs about half of what a unary call does.

One short typed method per RPC of LedgerService (runs' methods are mixed in from runs.py), and the plumbing they
share: the channel, the retry policy, the append path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

import grpc

from services import wire
from services._gen.agl.v1 import (
    event_pb2,
    ledger_service_pb2,
    ledger_service_pb2_grpc,
    model_pb2,
    proxy_control_pb2,
    rollout_pb2,
)

from .append_batcher import AppendBatcher
from .append_stream import AppendStream
from .errors import Unavailable, typed
from .resumable import resumable, revision_watch
from .retry import RetryPolicy
from .runs import RunMethods

log = logging.getLogger(__name__)

_DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
_APPEND_METHOD = "/agl.v1.LedgerService/AppendEvents"
_APPEND_STREAM_METHOD = "/agl.v1.LedgerService/StreamAppendEvents"
_STREAM_MESSAGE_BYTES = 512 * 1024
_EVENTS_FIELD = wire.number(ledger_service_pb2.AppendEventsRequest, "events")
_EVENT_ID_FIELD = wire.number(event_pb2.Event, "event_id")
_ALLOW_TERMINAL = ledger_service_pb2.AppendEventsRequest(allow_terminal=True).SerializeToString()


class LedgerClient(RunMethods):
    """Async client of agl.v1.LedgerService. Create it anywhere; the channel opens on first use."""

    def __init__(
        self,
        address: str,
        key: str | None = None,
        *,
        retry: RetryPolicy | None = None,
        max_message_bytes: int = _DEFAULT_MAX_MESSAGE_BYTES,
        call_timeout_s: float | None = 30.0,
    ) -> None:
        self.address = address
        self._metadata: tuple[tuple[str, str], ...] | None = (("authorization", f"Bearer {key}"),) if key else None
        self._retry = retry or RetryPolicy()
        self._max_message_bytes = max_message_bytes
        self._call_timeout_s = call_timeout_s
        self._channel: grpc.aio.Channel | None = None
        self._stub: ledger_service_pb2_grpc.LedgerServiceStub | None = None
        self._append_raw: Callable[..., Awaitable[ledger_service_pb2.AppendEventsResponse]] | None = None
        self._append_stream = AppendStream(self._open_append_stream, self._retry, call_timeout_s)
        # A merged request stops growing past this size. A larger single call goes alone, as a unary call: the
        # ledger's message limit is at least 1 MiB, so nothing sent on the stream can exceed it (one message over
        # the limit would end the stream, and with it the other callers' requests).
        self._max_batch_bytes = min(_STREAM_MESSAGE_BYTES, max_message_bytes // 2)
        self._appends = AppendBatcher(self._send_append, max_batch_bytes=self._max_batch_bytes)

    # -- plumbing -------------------------------------------------------------------------------------------

    @property
    def stub(self) -> ledger_service_pb2_grpc.LedgerServiceStub:
        if self._stub is None:
            options = [
                ("grpc.max_send_message_length", self._max_message_bytes),
                ("grpc.max_receive_message_length", self._max_message_bytes),
                ("grpc.keepalive_time_ms", 30_000),
                ("grpc.keepalive_permit_without_calls", 1),
                # grpc's own reconnect backoff grows to 120 s: a ledger back after a minute's outage would see this
                # channel fail every call at once (TRANSIENT_FAILURE) for a minute or two more. Capped like the
                # retry policy's, it reconnects within 2 s of the ledger's return.
                ("grpc.initial_reconnect_backoff_ms", 100),
                ("grpc.max_reconnect_backoff_ms", 2_000),
            ]
            self._channel = grpc.aio.insecure_channel(self.address, options=options)
            self._stub = ledger_service_pb2_grpc.LedgerServiceStub(self._channel)
            # AppendEvents taking requests already serialized, so merged ones are plain concatenations.
            self._append_raw = self._channel.unary_unary(
                _APPEND_METHOD, response_deserializer=ledger_service_pb2.AppendEventsResponse.FromString
            )
        return self._stub

    @property
    def metadata(self) -> tuple[tuple[str, str], ...] | None:
        return self._metadata

    @property
    def append_requests(self) -> int:
        """AppendEvents requests sent so far (fewer than append_events calls when calls were merged)."""
        return self._appends.requests

    @property
    def append_streams_opened(self) -> int:
        """StreamAppendEvents calls opened so far (one, unless the ledger went away or restarted)."""
        return self._append_stream.streams_opened

    async def close(self) -> None:
        self._appends.cancel()
        await self._append_stream.close()
        if self._channel is not None:
            await self._channel.close()
        self._channel = None
        self._stub = None
        self._append_raw = None

    async def __aenter__(self) -> LedgerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _unary(self, method: str, request: Any, timeout_s: float | None = None) -> Any:
        return await self._with_retries(method, getattr(self.stub, method), request, timeout_s)

    async def _every_page(self, method: str, request: Any, items: str) -> list[Any]:
        """Every item of a paginated List call: the request's pages in order, `items` naming the response's list."""
        found: list[Any] = []
        while True:
            response = await self._unary(method, request)
            found.extend(getattr(response, items))
            if not response.next_page_token:
                return found
            request.page_token = response.next_page_token

    async def _with_retries(
        self, method: str, call: Callable[..., Awaitable[Any]], request: Any, timeout_s: float | None = None
    ) -> Any:
        delays = self._retry.delays()
        while True:
            try:
                return await call(request, metadata=self._metadata, timeout=timeout_s or self._call_timeout_s)
            except grpc.aio.AioRpcError as raw:
                err = typed(raw)  # the client's edge: callers see only the typed errors of errors.py
                if not isinstance(err, Unavailable):
                    raise err from None
                delay = next(delays, None)
                if delay is None:
                    raise err from None
                log.debug("ledger %s unavailable (%s); retrying in %.3fs", method, err.details(), delay)
                await asyncio.sleep(delay)

    # -- rollouts -------------------------------------------------------------------------------------------

    async def create_rollouts(self, specs: Sequence[rollout_pb2.RolloutSpec]) -> list[rollout_pb2.Rollout]:
        """Creates rollouts; ids are filled in first so that a retry never creates twice."""
        request = ledger_service_pb2.CreateRolloutsRequest()
        for spec in specs:
            item = request.rollouts.add()
            item.CopyFrom(spec)
            if not item.rollout_id:
                item.rollout_id = f"ro-{uuid.uuid4().hex}"
        response = await self._unary("CreateRollouts", request)
        return list(response.rollouts)

    async def get_rollout(self, rollout_id: str) -> rollout_pb2.Rollout:
        response = await self._unary("GetRollout", ledger_service_pb2.GetRolloutRequest(rollout_id=rollout_id))
        return response.rollout

    async def list_rollouts(
        self,
        states: Iterable[int] = (),
        labels: Mapping[str, str] | None = None,
        controller_id: str = "",
        page_size: int = 500,
    ) -> list[rollout_pb2.Rollout]:
        """Every matching rollout (walks all pages)."""
        request = ledger_service_pb2.ListRolloutsRequest(
            states=list(states), label_selector=dict(labels or {}), controller_id=controller_id, page_size=page_size
        )
        return await self._every_page("ListRollouts", request, "rollouts")

    async def list_rollouts_page(
        self,
        states: Iterable[int] = (),
        labels: Mapping[str, str] | None = None,
        page_size: int = 100,
        page_token: str = "",
    ) -> ledger_service_pb2.ListRolloutsResponse:
        """One page of matching rollouts, in creation order, with the token of the next page."""
        request = ledger_service_pb2.ListRolloutsRequest(
            states=list(states), label_selector=dict(labels or {}), page_size=page_size, page_token=page_token
        )
        return await self._unary("ListRollouts", request)

    async def delete_rollouts(self, rollout_ids: Iterable[str]) -> int:
        request = ledger_service_pb2.DeleteRolloutsRequest(rollout_ids=list(rollout_ids))
        response = await self._unary("DeleteRollouts", request)
        return response.deleted_count

    async def update_status(
        self,
        rollout_id: str,
        state: int,
        *,
        error_message: str = "",
        attempt_id: str = "",
        launcher_ref: str = "",
        controller_id: str = "",
        expected_version: int | None = None,
        failure_reason: int = 0,
        ending_attempt_id: str = "",
    ) -> rollout_pb2.Rollout:
        """Moves a rollout along its state machine; with expected_version it is a compare-and-set.

        FAILED with a failure_reason that the rollout's retry policy retries puts it back in the queue for its next
        attempt (the returned rollout shows QUEUING); ending_attempt_id makes the report apply only to that attempt.

        A retry after a lost response can meet ABORTED or FAILED_PRECONDITION although the first try applied:
        callers that claim re-read the rollout to see whether the claim is theirs.
        """
        request = ledger_service_pb2.UpdateRolloutStatusRequest(
            rollout_id=rollout_id,
            state=state,
            error_message=error_message,
            attempt_id=attempt_id,
            launcher_ref=launcher_ref,
            controller_id=controller_id,
            failure_reason=failure_reason,  # type: ignore[arg-type]
            ending_attempt_id=ending_attempt_id,
        )
        if expected_version is not None:
            request.expected_version = expected_version
        response = await self._unary("UpdateRolloutStatus", request)
        return response.rollout

    # -- events ---------------------------------------------------------------------------------------------

    async def append_events(
        self, events: Sequence[event_pb2.Event], allow_terminal: bool = False, timeout_s: float | None = None
    ) -> ledger_service_pb2.AppendEventsResponse:
        """Appends events atomically; event ids are filled in first so that a retry never duplicates.

        A rollout that has ended refuses the events (FAILED_PRECONDITION) unless allow_terminal is set (for writes
        that belong after the end, such as the trainer's hook events).

        Concurrent calls share AppendEvents requests (see the module docstring); the answer holds this call's
        sequences and attempt ids only, and an error is this call's own. The whole call, waiting for a shared
        request included, is bounded by timeout_s (default: the client's call timeout), then DEADLINE_EXCEEDED.
        """
        # The request is written field by field around each event's own serialization: copying the events into
        # an AppendEventsRequest first cost more than serializing them. An event without an id gets one appended
        # as its event_id field (absent before, so it is the value a parser sees); the caller's event is unchanged.
        parts = []
        for event in events:
            serialized = event.SerializeToString()
            if not event.event_id:
                serialized += wire.field(_EVENT_ID_FIELD, uuid.uuid4().hex.encode())
            parts.append(wire.field(_EVENTS_FIELD, serialized))
        if allow_terminal:
            parts.append(_ALLOW_TERMINAL)
        deadline = timeout_s or self._call_timeout_s
        return await self._appends.submit(b"".join(parts), len(events), allow_terminal, deadline)

    async def _send_append(self, request: bytes) -> ledger_service_pb2.AppendEventsResponse:
        """One AppendEvents request, already serialized (merged calls are plain concatenations): over the append
        stream, or as a unary call when it is larger than a merged request may grow."""
        if len(request) <= self._max_batch_bytes:
            return await self._append_stream.send(request)
        if self._append_raw is None:
            _ = self.stub  # opens the channel
        assert self._append_raw is not None
        return await self._with_retries("AppendEvents", self._append_raw, request)

    def _open_append_stream(self) -> grpc.aio.StreamStreamCall:
        _ = self.stub  # opens the channel
        assert self._channel is not None
        call = self._channel.stream_stream(
            _APPEND_STREAM_METHOD, response_deserializer=ledger_service_pb2.StreamAppendEventsResponse.FromString
        )
        return call(metadata=self._metadata)

    async def list_events(
        self,
        rollout_id: str,
        attempt_id: str = "",
        event_type: str = "",
        view: int = event_pb2.EVENT_VIEW_FULL,
        page_size: int = 1000,
    ) -> list[event_pb2.Event]:
        """Every matching event of the rollout, in sequence order (walks all pages)."""
        request = ledger_service_pb2.ListEventsRequest(
            rollout_id=rollout_id, attempt_id=attempt_id, event_type=event_type, view=view, page_size=page_size
        )
        return await self._every_page("ListEvents", request, "events")

    # -- streams --------------------------------------------------------------------------------------------

    def watch_rollouts(
        self,
        states: Iterable[int] = (),
        labels: Mapping[str, str] | None = None,
        after_revision: int = 0,
    ) -> AsyncIterator[ledger_service_pb2.WatchRolloutsResponse]:
        """Snapshot then changes; reconnects and resumes after the last revision it delivered.

        When the ledger no longer keeps that revision (OUT_OF_RANGE) it starts over with a fresh snapshot.
        """
        states, selector = list(states), dict(labels or {})

        def open_after(revision: int) -> Any:
            request = ledger_service_pb2.WatchRolloutsRequest(
                states=states, label_selector=selector, after_revision=revision
            )
            return self.stub.WatchRollouts(request, metadata=self._metadata)

        snapshot = ledger_service_pb2.ROLLOUT_CHANGE_TYPE_SNAPSHOT
        return revision_watch("rollout watch", open_after, after_revision, snapshot, self._retry)

    async def watch_terminal(
        self,
        after_cursor: int = 0,
        labels: Mapping[str, str] | None = None,
        include_events: bool = True,
    ) -> AsyncIterator[ledger_service_pb2.TerminalRollout]:
        """Terminal rollouts in completion order; reconnects and resumes after the last cursor delivered."""
        selector = dict(labels or {})
        cursor = after_cursor

        def open_call() -> Any:
            request = ledger_service_pb2.WatchTerminalRolloutsRequest(
                after_cursor=cursor, label_selector=selector, include_events=include_events
            )
            return self.stub.WatchTerminalRollouts(request, metadata=self._metadata)

        # Closed with its consumer: the call ends then, not when the generator is collected.
        async with contextlib.aclosing(resumable("terminal watch", open_call, self._retry)) as stream:
            async for message in stream:
                cursor = message.entry.cursor
                yield message.entry

    async def list_terminal(
        self,
        after_cursor: int = 0,
        labels: Mapping[str, str] | None = None,
        include_events: bool = False,
        page_size: int = 100,
    ) -> ledger_service_pb2.ListTerminalRolloutsResponse:
        """One page of the terminal log after a cursor."""
        request = ledger_service_pb2.ListTerminalRolloutsRequest(
            after_cursor=after_cursor,
            label_selector=dict(labels or {}),
            include_events=include_events,
            page_size=page_size,
        )
        return await self._unary("ListTerminalRollouts", request)

    # -- models ---------------------------------------------------------------------------------------------

    async def register_models(self, endpoints: Sequence[model_pb2.ModelEndpoint]) -> list[model_pb2.ModelEndpoint]:
        response = await self._unary("RegisterModels", ledger_service_pb2.RegisterModelsRequest(endpoints=endpoints))
        return list(response.endpoints)

    async def list_models(self, model_name: str = "") -> list[model_pb2.ModelEndpoint]:
        request = ledger_service_pb2.ListModelsRequest(model_name=model_name, page_size=500)
        return await self._every_page("ListModels", request, "endpoints")

    async def delete_models(self, keys: Sequence[model_pb2.ModelEndpointKey]) -> int:
        response = await self._unary("DeleteModels", ledger_service_pb2.DeleteModelsRequest(keys=keys))
        return response.deleted_count

    async def watch_models(
        self, model_name: str = "", on_cut: Callable[[], None] | None = None
    ) -> AsyncIterator[ledger_service_pb2.WatchModelsResponse]:
        """The whole endpoint set, first as it is, then after every change; reconnects by itself, telling `on_cut`
        each time the stream is cut (the set may change unseen until the next message)."""
        async for message in self._watch_forever(
            "WatchModels", ledger_service_pb2.WatchModelsRequest(model_name=model_name), on_cut
        ):
            yield message

    # -- proxy control --------------------------------------------------------------------------------------

    async def set_proxy_pause(
        self,
        paused: bool,
        retry_after_seconds: int = 5,
        reason: str = "",
        owner: str = "",
        lease_seconds: float = 0.0,
        model_name: str = "",
    ) -> proxy_control_pb2.ProxyControl:
        """Pauses or resumes every proxy call, or with `model_name` only the calls routed to that model."""
        request = ledger_service_pb2.SetProxyPauseRequest(
            paused=paused,
            retry_after_seconds=retry_after_seconds,
            reason=reason,
            owner=owner,
            lease_seconds=lease_seconds,
            model_name=model_name,
        )
        return (await self._unary("SetProxyPause", request)).control

    async def report_proxy_replica(
        self,
        replica_id: str,
        in_flight: int,
        observed_generation: int,
        ttl_seconds: float = 15.0,
        leaving: bool = False,
        timeout_s: float | None = None,
        model_in_flight: Mapping[str, int] | None = None,
    ) -> proxy_control_pb2.ProxyControl:
        request = ledger_service_pb2.ReportProxyReplicaRequest(
            replica_id=replica_id,
            in_flight=in_flight,
            observed_generation=observed_generation,
            ttl_seconds=ttl_seconds,
            leaving=leaving,
            model_in_flight=model_in_flight or {},
        )
        return (await self._unary("ReportProxyReplica", request, timeout_s)).control

    async def get_proxy_control(self) -> proxy_control_pb2.ProxyControl:
        return (await self._unary("GetProxyControl", ledger_service_pb2.GetProxyControlRequest())).control

    async def watch_proxy_control(self) -> AsyncIterator[proxy_control_pb2.ProxyControl]:
        """The proxy control state, first as it is, then after every change; reconnects by itself."""
        async for message in self._watch_forever("WatchProxyControl", ledger_service_pb2.WatchProxyControlRequest()):
            yield message.control

    # -- controller leases -----------------------------------------------------------------------------------------

    async def renew_controller_lease(
        self, controller_id: str, ttl_seconds: float = 30.0, leaving: bool = False, timeout_s: float | None = None
    ) -> ledger_service_pb2.RenewControllerLeaseResponse:
        """A controller's heartbeat: its lease, and the expired leases of controllers that still own RUNNING
        rollouts (for the caller to take over)."""
        request = ledger_service_pb2.RenewControllerLeaseRequest(
            controller_id=controller_id, ttl_seconds=ttl_seconds, leaving=leaving
        )
        return await self._unary("RenewControllerLease", request, timeout_s=timeout_s)

    async def _watch_forever(
        self, method: str, request: Any, on_cut: Callable[[], None] | None = None
    ) -> AsyncIterator[Any]:
        # For state-style streams (each message is the whole state) a reconnect simply starts over.
        def open_call() -> Any:
            return getattr(self.stub, method)(request, metadata=self._metadata)

        # Closed with its consumer: the call ends then, not when the generator is collected.
        async with contextlib.aclosing(resumable(method, open_call, self._retry, on_cut=on_cut)) as stream:
            async for message in stream:
                yield message
