"""Appends over the ledger's StreamAppendEvents: one long-lived stream, and group commit of concurrent appends.

Appends that are waiting when the stream is ready to send go out together as one AppendEvents request (the
ledger acknowledges it once durable, in stream order), and the answer's sequences are handed back to each
caller. A batch is atomic in the ledger, so when one is refused (say one of its rollouts has finished) its
appends are sent again one by one, and each caller gets its own answer.

If the stream breaks, every unacknowledged append is sent again on a new stream; this is safe because every
event carries its event id (the ledger stores a retried id once). An append still unacknowledged when a stream
breaks after `retry_budget_s`, or after `timeout_s` in any case, fails with 503: the agent is told, never left
hanging.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import grpc

from services._gen.agl.v1 import event_pb2
from services._gen.agl.v1 import ledger_service_pb2 as pb
from services.client import LedgerClient

from .errors import ProxyError, ledger_error

log = logging.getLogger(__name__)

_CODE_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}
_TRANSIENT = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "INTERNAL", "CANCELLED", "ABORTED"})
_MAX_BATCH = 128


@dataclass
class _Pending:
    append: bytes  # a serialized AppendEventsRequest
    events: int
    future: asyncio.Future[pb.AppendEventsResponse]
    queued_at: float
    solo: bool = False  # send alone (its batch was refused)


class AppendStream:
    def __init__(
        self,
        client: LedgerClient,
        *,
        timeout_s: float = 10.0,
        retry_budget_s: float = 1.5,
        initial_backoff_s: float = 0.05,
        max_backoff_s: float = 1.0,
    ) -> None:
        self._client = client
        self._timeout = timeout_s
        self._retry_budget = retry_budget_s
        self._initial_backoff = initial_backoff_s
        self._max_backoff = max_backoff_s
        self._ready: deque[_Pending] = deque()
        self._wakeup = asyncio.Event()
        self._inflight: dict[int, list[_Pending]] = {}  # stream request id -> its appends, in order
        self._next_id = 0
        self._generation = 0
        self._runner: asyncio.Task[None] | None = None
        self.batches = 0  # stream requests sent (a benchmark figure)

    async def append(self, events: Sequence[event_pb2.Event], reject_terminal: bool = False) -> pb.AppendEventsResponse:
        """Appends atomically, like AppendEvents; ledger errors come back as ProxyError."""
        request = pb.AppendEventsRequest(reject_terminal=reject_terminal)
        for event in events:
            item = request.events.add()
            item.CopyFrom(event)
            if not item.event_id:
                item.event_id = uuid.uuid4().hex
        future: asyncio.Future[pb.AppendEventsResponse] = asyncio.get_running_loop().create_future()
        self._ready.append(_Pending(request.SerializeToString(), len(events), future, time.monotonic()))
        self._wakeup.set()
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(self._run())
        try:
            return await asyncio.wait_for(asyncio.shield(future), self._timeout)
        except (TimeoutError, asyncio.TimeoutError):
            raise ProxyError(
                "ledger_unavailable",
                f"The ledger did not acknowledge within {self._timeout:g}s; the call was not recorded.",
            ) from None
        finally:
            if not future.done():
                future.cancel()  # skipped from now on

    async def close(self) -> None:
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
        for pending in [*self._ready, *(p for batch in self._inflight.values() for p in batch)]:
            if not pending.future.done():
                pending.future.set_exception(ProxyError("ledger_unavailable", "The proxy is shutting down."))

    # -- the stream -------------------------------------------------------------------------------------------

    async def _requests(self, generation: int) -> AsyncIterator[pb.StreamAppendEventsRequest]:
        while True:
            while not self._ready:
                self._wakeup.clear()
                await self._wakeup.wait()
                if generation != self._generation:
                    return  # a newer stream owns the queue
            if generation != self._generation:
                return
            batch: list[_Pending] = []
            while self._ready and len(batch) < _MAX_BATCH:
                pending = self._ready[0]
                if pending.future.done():
                    self._ready.popleft()
                    continue
                if pending.solo and batch:
                    break
                batch.append(self._ready.popleft())
                if pending.solo:
                    break
            if not batch:
                continue
            request = pb.StreamAppendEventsRequest(request_id=self._next_id)
            self._next_id += 1
            request.append.MergeFromString(b"".join(p.append for p in batch))
            self._inflight[request.request_id] = batch
            self.batches += 1
            yield request

    async def _run(self) -> None:
        failures = 0
        while True:
            call = self._client.stub.StreamAppendEvents(
                self._requests(self._generation), metadata=self._client.metadata
            )
            try:
                async for response in call:
                    failures = 0
                    self._resolve(response)
                status_name, details = "UNAVAILABLE", "the ledger ended the append stream"
            except grpc.aio.AioRpcError as err:
                status_name, details = err.code().name, err.details() or ""
            finally:
                call.cancel()
            self._generation += 1
            self._requeue(status_name, details)
            if not self._ready:
                return  # nothing waits: the next append opens a new stream
            failures += 1
            ceiling = min(self._initial_backoff * 2 ** (failures - 1), self._max_backoff)
            await asyncio.sleep(random.uniform(ceiling / 2, ceiling))

    def _resolve(self, response: pb.StreamAppendEventsResponse) -> None:
        batch = self._inflight.pop(response.request_id, None)
        if batch is None:
            return
        if not response.error_code:
            sequences, attempts, start = response.append.sequences, response.append.attempt_ids, 0
            for pending in batch:
                end = start + pending.events
                if not pending.future.done():
                    part = pb.AppendEventsResponse(sequences=sequences[start:end], attempt_ids=attempts[start:end])
                    pending.future.set_result(part)
                start = end
            return
        name = _CODE_NAMES.get(response.error_code, "UNKNOWN")
        if len(batch) > 1 and name not in _TRANSIENT:
            for pending in reversed(batch):  # find out whose append it was: send each alone, first in line
                pending.solo = True
                self._ready.appendleft(pending)
            self._wakeup.set()
            return
        for pending in batch:
            if not pending.future.done():
                pending.future.set_exception(ledger_error(name, response.error_message, "AppendEvents"))

    def _requeue(self, status_name: str, details: str) -> None:
        """The stream broke: fail appends that used up their budget, line the others up for a new stream."""
        unacknowledged = [p for request_id in sorted(self._inflight) for p in self._inflight[request_id]]
        self._inflight.clear()
        now = time.monotonic()
        kept: deque[_Pending] = deque()
        for pending in [*unacknowledged, *self._ready]:
            if pending.future.done():
                continue
            if status_name not in _TRANSIENT or now - pending.queued_at >= self._retry_budget:
                pending.future.set_exception(ledger_error(status_name, details, "AppendEvents"))
            else:
                kept.append(pending)
        self._ready = kept
        self._wakeup.set()
        log.debug("append stream broken (%s: %s); %d append(s) to resend", status_name, details, len(kept))
