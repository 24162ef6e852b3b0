"""Coalescing of concurrent AppendEvents calls, used by LedgerClient.append_events.

While one AppendEvents request is in flight, the calls that arrive queue up and go out together as the next
request the moment it returns (no timer: a lone call is sent at once). Calls with allow_terminal set and calls
without it wait in separate lanes, since the flag belongs to the whole request. Each caller gets its own part of
the answer. The ledger applies a request atomically, so a merged request it refuses may have been refused for one
caller's events alone (its rollout is gone, an event id it reused with other content): then each part is sent
again alone, all at once, and every caller gets the answer to its own events. A refusal of one caller's events
never reaches another caller; only a status about the request as a whole (the ledger away, the proxy's own key
refused, the deadline) is shared by everyone in it.

Merging needs no parsing: serialized AppendEventsRequests concatenate into one request with all their events.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import grpc

from services._gen.agl.v1 import ledger_service_pb2

from . import errors
from .append_stream import await_within

log = logging.getLogger(__name__)

Response = ledger_service_pb2.AppendEventsResponse
# Sends one serialized AppendEventsRequest (retrying UNAVAILABLE as every unary call does).
SendAppend = Callable[[bytes], Awaitable[ledger_service_pb2.AppendEventsResponse]]

# A merged append refused with one of these was refused as a whole, whatever it held: each caller gets the status.
# Anything else (a bad event, a missing rollout, a reused event id, an error nobody expected) may be one caller's
# doing, so each part is then sent alone and only its own caller sees its own answer.
_REQUEST_WIDE: tuple[type[errors.LedgerError], ...] = (
    errors.Transient,  # UNAVAILABLE, DEADLINE_EXCEEDED
    errors.Cancelled,
    errors.Refused,  # UNAUTHENTICATED, PERMISSION_DENIED
    errors.Unimplemented,
)


@dataclass
class _PendingAppend:
    """One call waiting in its lane: its serialized AppendEventsRequest and the caller's future."""

    request: bytes
    events: int
    future: asyncio.Future[ledger_service_pb2.AppendEventsResponse]


@dataclass
class _AppendLane:
    """Calls with the same allow_terminal flag, merged into one request while the previous one is in flight."""

    queue: collections.deque[_PendingAppend] = field(default_factory=collections.deque)
    sender: asyncio.Task[None] | None = None


class AppendBatcher:
    """Queues append calls per lane and sends each lane's queue as merged requests, one at a time."""

    def __init__(self, send: SendAppend, max_batch_bytes: int) -> None:
        self._send = send
        # A merged request stops growing past this size (a larger single call still goes, alone).
        self._max_batch_bytes = max_batch_bytes
        self._lanes = {flag: _AppendLane() for flag in (False, True)}
        self.requests = 0  # AppendEvents requests sent (merged or not)

    async def submit(self, request: bytes, events: int, allow_terminal: bool, timeout_s: float | None) -> Response:
        """Sends a serialized AppendEventsRequest of `events` events (its allow_terminal flag given too), merged
        with whatever else is waiting; returns this request's part of the answer.

        `timeout_s` bounds the whole wait, queueing included: past it the caller gets DEADLINE_EXCEEDED, and
        its events are not sent if they were still queued (if they were in flight they may still be stored)."""
        loop = asyncio.get_running_loop()
        lane = self._lanes[allow_terminal]
        if lane.sender is not None and lane.sender.get_loop() is not loop:  # the client moved to another loop
            lane.sender, lane.queue = None, collections.deque()
        future: asyncio.Future[Response] = loop.create_future()
        lane.queue.append(_PendingAppend(request, events, future))
        if lane.sender is None or lane.sender.done():
            lane.sender = asyncio.create_task(self._drain(lane))
        return await await_within(future, timeout_s, "the ledger did not acknowledge the append within {:g}s")

    def cancel(self) -> None:
        """Stops sending (the client is closing): callers still waiting are cancelled."""
        for lane in self._lanes.values():
            if lane.sender is not None and not lane.sender.done():
                lane.sender.cancel()

    async def _drain(self, lane: _AppendLane) -> None:
        """Everything queued goes out as one request; what queues meanwhile goes next."""
        batch: list[_PendingAppend] = []
        try:
            while lane.queue:
                batch, size = [], 0
                while lane.queue and (not batch or size + len(lane.queue[0].request) <= self._max_batch_bytes):
                    pending = lane.queue.popleft()
                    if not pending.future.done():  # a cancelled caller's events are not sent
                        batch.append(pending)
                        size += len(pending.request)
                if batch:
                    await self._send_batch(batch)
        except BaseException as exc:  # cancelled (client closing) or a bug: nobody is left waiting
            if isinstance(exc, Exception):
                log.exception("appending to the ledger failed unexpectedly")
            for pending in [*batch, *lane.queue]:
                if not pending.future.done():
                    if isinstance(exc, asyncio.CancelledError):
                        pending.future.cancel()
                    else:
                        pending.future.set_exception(exc)
            lane.queue.clear()
            if not isinstance(exc, Exception):
                raise

    async def _send_batch(self, batch: list[_PendingAppend]) -> None:
        self.requests += 1
        try:
            response = await self._send(b"".join(p.request for p in batch))
        except grpc.aio.AioRpcError as raw:
            err = errors.typed(raw)
            if len(batch) > 1 and not isinstance(err, _REQUEST_WIDE):
                log.debug("merged append of %d calls refused (%s); sending each alone", len(batch), err.code_name)
                # All at once: the parts are written in queue order (each caller's events keep their order) and
                # the ledger answers them together, so a refused merge costs one more round trip, not one per part.
                await asyncio.gather(*(self._send_batch([p]) for p in batch if not p.future.done()))
                return
            for pending in batch:
                if not pending.future.done():
                    pending.future.set_exception(errors.copy(err) if len(batch) > 1 else err)
            return
        if len(batch) == 1:
            if not batch[0].future.done():
                batch[0].future.set_result(response)
            return
        sequences, attempts, start = response.sequences, response.attempt_ids, 0
        for pending in batch:
            end = start + pending.events
            if not pending.future.done():
                pending.future.set_result(Response(sequences=sequences[start:end], attempt_ids=attempts[start:end]))
            start = end
