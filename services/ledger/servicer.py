"""The gRPC face of the ledger: unpack the request, call the core, pack the response.

Requests arrive as bytes and are parsed here so that a malformed message is INVALID_ARGUMENT like any other
bad input. Domain errors become status codes through `STATUS_BY_ERROR`, the one table, applied by the `rpc`
decorator to unary and streaming methods alike.

One short method per RPC of LedgerService, each unpack, call, pack; the streaming ones add their flow control.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass

from services import wire
from services._gen.agl.v1 import ledger_service_pb2 as pb
from services._gen.agl.v1 import rollout_pb2

from . import errors, feeds
from .ledger import DELETE, Ledger
from .paging import page_size, parse_token

log = logging.getLogger(__name__)

STATUS_BY_ERROR: dict[type[errors.LedgerError], grpc.StatusCode] = {
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    errors.AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    errors.FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    errors.Aborted: grpc.StatusCode.ABORTED,
    errors.OutOfRange: grpc.StatusCode.OUT_OF_RANGE,
    errors.ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.QuotaExceeded: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
}

SERVICE = pb.DESCRIPTOR.services_by_name["LedgerService"]
SHUTTING_DOWN = "the ledger is shutting down; reconnect and resume"


def _status(exc: errors.LedgerError) -> grpc.StatusCode:
    for cls in type(exc).__mro__:
        if cls in STATUS_BY_ERROR:
            return STATUS_BY_ERROR[cls]
    return grpc.StatusCode.UNKNOWN


async def _abort_for(exc: BaseException, context: grpc.aio.ServicerContext, method: str) -> None:
    if isinstance(exc, DecodeError):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed {method} request: {exc}")
    if isinstance(exc, errors.LedgerError):
        await context.abort(_status(exc), str(exc))
    log.exception("%s failed unexpectedly", method)
    await context.abort(grpc.StatusCode.UNKNOWN, f"{method}: internal error {type(exc).__name__}: {exc}")


def rpc(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Parse the raw request, run the method and map domain errors to status codes (unary and streaming)."""
    method = SERVICE.methods_by_name[fn.__name__]
    request_type = GetMessageClass(method.input_type)
    if method.server_streaming:

        @functools.wraps(fn)
        async def stream(self: LedgerServicer, raw: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            task = asyncio.current_task()
            self.streams.add(task)
            try:
                request = request_type.FromString(raw)
                async with contextlib.aclosing(fn(self, request, context)) as items:
                    async for item in items:
                        yield item
            except asyncio.CancelledError:
                if not self.closing:
                    raise
                await context.abort(grpc.StatusCode.UNAVAILABLE, SHUTTING_DOWN)
            except grpc.aio.AbortError:
                raise
            except Exception as exc:
                await _abort_for(exc, context, method.name)
            finally:
                self.streams.discard(task)

        return stream

    @functools.wraps(fn)
    async def unary(self: LedgerServicer, raw: bytes, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await fn(self, request_type.FromString(raw), context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await _abort_for(exc, context, method.name)

    return unary


def _serialize(message: Message | bytes) -> bytes:
    return message if isinstance(message, bytes) else message.SerializeToString()


_CURSOR_TAG = wire.varint(wire.number(pb.TerminalRollout, "cursor") << 3 | wire.VARINT)
_ROLLOUT_FIELD = wire.number(pb.TerminalRollout, "rollout")
_EVENTS_FIELD = wire.number(pb.TerminalRollout, "events")
_LIST_EVENTS_FIELD = wire.number(pb.ListEventsResponse, "events")
_WATCH_ENTRY_FIELD = wire.number(pb.WatchTerminalRolloutsResponse, "entry")
_LIST_ENTRIES_FIELD = wire.number(pb.ListTerminalRolloutsResponse, "entries")


def _terminal_entry(cursor: int, rollout: rollout_pb2.Rollout, events: list[bytes]) -> bytes:
    """A serialized TerminalRollout (cursor, rollout, events) with stored events spliced in unparsed."""
    return b"".join(
        (
            _CURSOR_TAG,
            wire.varint(cursor),
            wire.field(_ROLLOUT_FIELD, rollout.SerializeToString()),
            wire.repeated(_EVENTS_FIELD, events),
        )
    )


def _allow_terminal(request: pb.AppendEventsRequest) -> bool:
    """The request's allow_terminal; the deprecated reject_terminal (refusing is the default now) contradicts it."""
    if request.reject_terminal and request.allow_terminal:
        raise errors.InvalidArgument("reject_terminal and allow_terminal contradict each other; set at most one")
    return request.allow_terminal


class LedgerServicer:
    """Implements agl.v1.LedgerService over a `Ledger`."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.closing = False
        self.streams: set[asyncio.Task[Any] | None] = set()

    def register(self, server: grpc.aio.Server) -> None:
        handlers: dict[str, grpc.RpcMethodHandler] = {}
        for method in SERVICE.methods:
            behaviour = getattr(self, method.name)
            if method.client_streaming:
                make = grpc.stream_stream_rpc_method_handler
            elif method.server_streaming:
                make = grpc.unary_stream_rpc_method_handler
            else:
                make = grpc.unary_unary_rpc_method_handler
            handlers[method.name] = make(behaviour, request_deserializer=None, response_serializer=_serialize)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE.full_name, handlers),))
        server.add_registered_method_handlers(SERVICE.full_name, handlers)

    def close_streams(self) -> None:
        """Shutdown: end every open stream with UNAVAILABLE so its client reconnects (elsewhere or later)."""
        self.closing = True
        for task in list(self.streams):
            if task is not None:
                task.cancel()

    # -- rollouts --------------------------------------------------------------------------------------------------

    @rpc
    async def CreateRollouts(self, request: pb.CreateRolloutsRequest, context: Any) -> pb.CreateRolloutsResponse:
        results = await self.ledger.create_rollouts(list(request.rollouts))
        return pb.CreateRolloutsResponse(rollouts=[r for r, _ in results], created=[c for _, c in results])

    @rpc
    async def GetRollout(self, request: pb.GetRolloutRequest, context: Any) -> pb.GetRolloutResponse:
        return pb.GetRolloutResponse(rollout=await self.ledger.get_rollout(request.rollout_id))

    @rpc
    async def ListRollouts(self, request: pb.ListRolloutsRequest, context: Any) -> pb.ListRolloutsResponse:
        rollouts, token = await self.ledger.list_rollouts(
            request.states, request.label_selector, request.controller_id, request.page_size, request.page_token
        )
        return pb.ListRolloutsResponse(rollouts=rollouts, next_page_token=token)

    @rpc
    async def DeleteRollouts(self, request: pb.DeleteRolloutsRequest, context: Any) -> pb.DeleteRolloutsResponse:
        return pb.DeleteRolloutsResponse(deleted_count=await self.ledger.delete_rollouts(request.rollout_ids))

    @rpc
    async def UpdateRolloutStatus(
        self, request: pb.UpdateRolloutStatusRequest, context: Any
    ) -> pb.UpdateRolloutStatusResponse:
        rollout = await self.ledger.update_status(
            request.rollout_id,
            request.state,
            error_message=request.error_message,
            attempt_id=request.attempt_id,
            launcher_ref=request.launcher_ref,
            controller_id=request.controller_id,
            expected_version=request.expected_version if request.HasField("expected_version") else None,
            failure_reason=request.failure_reason,
            ending_attempt_id=request.ending_attempt_id,
        )
        return pb.UpdateRolloutStatusResponse(rollout=rollout)

    # -- events ----------------------------------------------------------------------------------------------------

    @rpc
    async def AppendEvents(self, request: pb.AppendEventsRequest, context: Any) -> pb.AppendEventsResponse:
        sequences, attempts = await self.ledger.append_events(request.events, _allow_terminal(request))
        return pb.AppendEventsResponse(sequences=sequences, attempt_ids=attempts)

    async def StreamAppendEvents(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> None:
        """Stage each request as it arrives (in order, so sequences follow the stream), and acknowledge it from a
        second task once durable; one request failing is answered with its error and the stream goes on."""
        # Headers first: the client writes only after them (client/append_stream.py says why).
        await context.send_initial_metadata(())
        acks: asyncio.Queue[tuple[int, pb.StreamAppendEventsResponse] | None] = asyncio.Queue()

        async def acknowledge() -> None:
            while (item := await acks.get()) is not None:
                lsn, response = item
                await self.ledger.durable(lsn)
                await context.write(response)

        sender = asyncio.create_task(acknowledge())
        task = asyncio.current_task()
        self.streams.add(task)
        try:
            async for raw in requests:
                await acks.put(self._stage_append(raw))
                if sender.done():
                    break
            acks.put_nowait(None)
            await sender
        except asyncio.CancelledError:
            if not self.closing:
                sender.cancel()
                raise
            acks.put_nowait(None)  # shutting down: acknowledge what was staged, then send the client elsewhere
            await sender
            await context.abort(grpc.StatusCode.UNAVAILABLE, SHUTTING_DOWN)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            sender.cancel()
            await _abort_for(exc, context, "StreamAppendEvents")
        finally:
            self.streams.discard(task)

    def _stage_append(self, raw: bytes) -> tuple[int, pb.StreamAppendEventsResponse]:
        try:
            request = pb.StreamAppendEventsRequest.FromString(raw)
        except DecodeError as exc:
            code, message = grpc.StatusCode.INVALID_ARGUMENT, f"malformed StreamAppendEvents request: {exc}"
            return 0, pb.StreamAppendEventsResponse(error_code=code.value[0], error_message=message)
        try:
            sequences, attempts, lsn = self.ledger.stage_events(request.append.events, _allow_terminal(request.append))
        except errors.LedgerError as exc:
            return 0, pb.StreamAppendEventsResponse(
                request_id=request.request_id, error_code=_status(exc).value[0], error_message=str(exc)
            )
        except Exception as exc:  # a bug: answered like a unary call would be, and the stream (others' too) goes on
            log.exception("StreamAppendEvents request %d failed unexpectedly", request.request_id)
            return 0, pb.StreamAppendEventsResponse(
                request_id=request.request_id,
                error_code=grpc.StatusCode.UNKNOWN.value[0],
                error_message=f"StreamAppendEvents: internal error {type(exc).__name__}: {exc}",
            )
        append = pb.AppendEventsResponse(sequences=sequences, attempt_ids=attempts)
        return lsn, pb.StreamAppendEventsResponse(request_id=request.request_id, append=append)

    @rpc
    async def ListEvents(self, request: pb.ListEventsRequest, context: Any) -> bytes:
        events, token = await self.ledger.list_events(
            request.rollout_id,
            request.attempt_id,
            request.event_type,
            request.view,
            request.page_size,
            request.page_token,
        )
        tail = pb.ListEventsResponse(next_page_token=token).SerializeToString()
        return wire.repeated(_LIST_EVENTS_FIELD, events) + tail

    # -- streams ---------------------------------------------------------------------------------------------------

    @rpc
    async def WatchRollouts(self, request: pb.WatchRolloutsRequest, context: Any) -> AsyncIterator[Any]:
        feed = feeds.watch_rollouts(self.ledger, request.states, request.label_selector, request.after_revision)
        async with contextlib.aclosing(feed):
            async for kind, revision, rollout in feed:
                if kind == DELETE and rollout is not None:
                    rollout = rollout_pb2.Rollout(rollout_id=rollout.rollout_id)
                yield pb.WatchRolloutsResponse(type=kind, revision=revision, rollout=rollout)

    @rpc
    async def WatchTerminalRollouts(self, request: pb.WatchTerminalRolloutsRequest, context: Any) -> AsyncIterator[Any]:
        feed = feeds.watch_terminal(self.ledger, request.after_cursor, request.label_selector, request.include_events)
        async with contextlib.aclosing(feed):
            async for item in feed:
                yield wire.field(_WATCH_ENTRY_FIELD, _terminal_entry(*item))

    @rpc
    async def ListTerminalRollouts(self, request: pb.ListTerminalRolloutsRequest, context: Any) -> bytes:
        items, reached = await feeds.list_terminal(
            self.ledger, request.after_cursor, request.label_selector, request.include_events, request.page_size
        )
        entries = wire.repeated(_LIST_ENTRIES_FIELD, (_terminal_entry(*item) for item in items))
        return entries + pb.ListTerminalRolloutsResponse(next_cursor=reached).SerializeToString()

    # -- models ----------------------------------------------------------------------------------------------------

    @rpc
    async def RegisterModels(self, request: pb.RegisterModelsRequest, context: Any) -> pb.RegisterModelsResponse:
        return pb.RegisterModelsResponse(endpoints=await self.ledger.register_models(list(request.endpoints)))

    @rpc
    async def ListModels(self, request: pb.ListModelsRequest, context: Any) -> pb.ListModelsResponse:
        size = page_size(request.page_size, 100, 1000)
        start = parse_token(request.page_token)
        endpoints = self.ledger.models.list(request.model_name)
        page = endpoints[start : start + size]
        more = start + size < len(endpoints)
        return pb.ListModelsResponse(endpoints=page, next_page_token=str(start + size) if more else "")

    @rpc
    async def DeleteModels(self, request: pb.DeleteModelsRequest, context: Any) -> pb.DeleteModelsResponse:
        return pb.DeleteModelsResponse(deleted_count=await self.ledger.delete_models(list(request.keys)))

    @rpc
    async def WatchModels(self, request: pb.WatchModelsRequest, context: Any) -> AsyncIterator[Any]:
        feed = feeds.watch_models(self.ledger, request.model_name)
        async with contextlib.aclosing(feed):
            async for revision, endpoints in feed:
                yield pb.WatchModelsResponse(revision=revision, endpoints=endpoints)

    # -- proxy control ---------------------------------------------------------------------------------------------

    @rpc
    async def SetProxyPause(self, request: pb.SetProxyPauseRequest, context: Any) -> pb.SetProxyPauseResponse:
        control = await self.ledger.set_proxy_pause(request)
        return pb.SetProxyPauseResponse(control=control)

    @rpc
    async def ReportProxyReplica(
        self, request: pb.ReportProxyReplicaRequest, context: Any
    ) -> pb.ReportProxyReplicaResponse:
        control = self.ledger.report_proxy_replica(request)
        return pb.ReportProxyReplicaResponse(control=control)

    @rpc
    async def RenewControllerLease(
        self, request: pb.RenewControllerLeaseRequest, context: Any
    ) -> pb.RenewControllerLeaseResponse:
        lease, expired = self.ledger.renew_controller_lease(request.controller_id, request.ttl_seconds, request.leaving)
        return pb.RenewControllerLeaseResponse(lease=lease, expired_leases=expired)

    @rpc
    async def GetProxyControl(self, request: pb.GetProxyControlRequest, context: Any) -> pb.GetProxyControlResponse:
        return pb.GetProxyControlResponse(control=self.ledger.proxy.snapshot())

    @rpc
    async def WatchProxyControl(self, request: pb.WatchProxyControlRequest, context: Any) -> AsyncIterator[Any]:
        feed = feeds.watch_proxy_control(self.ledger)
        async with contextlib.aclosing(feed):
            async for control in feed:
                yield pb.WatchProxyControlResponse(control=control)

    # -- runs ------------------------------------------------------------------------------------------------------

    @rpc
    async def CreateRun(self, request: pb.CreateRunRequest, context: Any) -> pb.CreateRunResponse:
        run, created = await self.ledger.runs.create(request.run_id, request.labels, request.config_json)
        return pb.CreateRunResponse(run=run, created=created)

    @rpc
    async def GetRun(self, request: pb.GetRunRequest, context: Any) -> pb.GetRunResponse:
        return pb.GetRunResponse(run=await self.ledger.runs.get(request.run_id))

    @rpc
    async def ListRuns(self, request: pb.ListRunsRequest, context: Any) -> pb.ListRunsResponse:
        runs, token = await self.ledger.runs.list(
            request.label_selector, request.states, request.page_size, request.page_token
        )
        return pb.ListRunsResponse(runs=runs, next_page_token=token)

    @rpc
    async def UpdateRunState(self, request: pb.UpdateRunStateRequest, context: Any) -> pb.UpdateRunStateResponse:
        run = await self.ledger.runs.update_state(request.run_id, request.state, request.error_message)
        return pb.UpdateRunStateResponse(run=run)

    @rpc
    async def DeleteRuns(self, request: pb.DeleteRunsRequest, context: Any) -> pb.DeleteRunsResponse:
        return pb.DeleteRunsResponse(deleted_count=await self.ledger.runs.delete(request.run_ids))

    @rpc
    async def ReportRunSteps(self, request: pb.ReportRunStepsRequest, context: Any) -> pb.ReportRunStepsResponse:
        steps, run = await self.ledger.runs.report_steps(request.run_id, list(request.steps))
        return pb.ReportRunStepsResponse(steps=steps, run=run)

    @rpc
    async def ListRunSteps(self, request: pb.ListRunStepsRequest, context: Any) -> pb.ListRunStepsResponse:
        steps, token = await self.ledger.runs.list_steps(
            request.run_id, request.after_step, request.metric_names, request.page_size, request.page_token
        )
        return pb.ListRunStepsResponse(steps=steps, next_page_token=token)

    @rpc
    async def WatchRuns(self, request: pb.WatchRunsRequest, context: Any) -> AsyncIterator[Any]:
        feed = self.ledger.runs.watch(
            request.run_id, request.label_selector, request.include_steps, request.after_revision
        )
        async with contextlib.aclosing(feed):
            async for kind, revision, run, step in feed:
                yield pb.WatchRunsResponse(type=kind, revision=revision, run=run, step=step)
