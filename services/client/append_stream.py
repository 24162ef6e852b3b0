"""AppendEvents requests carried over one long-lived StreamAppendEvents call.

On this kind of machine a unary gRPC call costs about twice the client and server CPU of one message on an open
stream, and its round trip is about twice as long (measured: 1.2-1.3 ms against 0.64 ms for a single ~3 KB event),
so the append path, which every proxied model call waits on, sends its requests here.

Each request gets an id, is written in submission order (the ledger stages them in that order, so sequences
follow it) and is answered by the response carrying the same id. A request the ledger refuses is answered with
its own status; the stream goes on. When the stream breaks (the ledger restarts, the connection drops), it is
opened again with jittered backoff and every unanswered request is written again, oldest first: retrying is
safe because the caller chose the event ids, so a request that was stored before the break is not stored twice.
After `retry.attempts` tries in a row without an answer, the unanswered requests fail with the last status.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from services import wire
from services._gen.agl.v1 import ledger_service_pb2

from . import errors
from .errors import LedgerError
from .retry import RetryPolicy

log = logging.getLogger(__name__)

Response = ledger_service_pb2.AppendEventsResponse
# Opens a StreamAppendEvents call that takes serialized requests and yields parsed responses.
OpenStream = Callable[[], grpc.aio.StreamStreamCall]

T = TypeVar("T")


@dataclass
class _Unanswered:
    frame: bytes  # the serialized StreamAppendEventsRequest
    future: asyncio.Future[Response]


_REQUEST_ID_TAG = wire.varint(wire.number(ledger_service_pb2.StreamAppendEventsRequest, "request_id") << 3)
_APPEND_FIELD = wire.number(ledger_service_pb2.StreamAppendEventsRequest, "append")


def frame(request_id: int, request: bytes) -> bytes:
    """StreamAppendEventsRequest{request_id, append} around an already serialized AppendEventsRequest, so the
    events are not parsed and encoded again."""
    return _REQUEST_ID_TAG + wire.varint(request_id) + wire.field(_APPEND_FIELD, request)


def _error(code: grpc.StatusCode, details: str) -> LedgerError:
    return errors.error(code, details)


async def await_within(future: asyncio.Future[T], seconds: float | None, details: str) -> T:
    """Awaits the future; unless it is done within `seconds` (None: no deadline) it fails with DEADLINE_EXCEEDED,
    `details` formatted with the seconds.

    A timer handle rather than asyncio.timeout or wait_for: it costs about a third of either (no Timeout object,
    no task cancellation), which counts on the append path that every proxied model call waits on, and it works
    the same on Python 3.10 (the client runs inside trainer images too)."""
    if seconds is None:
        return await future
    timer = future.get_loop().call_later(seconds, _expire, future, details.format(seconds))
    try:
        return await future
    finally:
        timer.cancel()


def _expire(future: asyncio.Future[Any], details: str) -> None:
    if not future.done():
        future.set_exception(_error(grpc.StatusCode.DEADLINE_EXCEEDED, details))


_CODES = {code.value[0]: code for code in grpc.StatusCode}


class AppendStream:
    """Sends serialized AppendEventsRequests over one stream at a time; `send` returns the request's answer."""

    def __init__(self, open_stream: OpenStream, retry: RetryPolicy, timeout_s: float | None) -> None:
        self._open_stream = open_stream
        self._retry = retry
        self._timeout_s = timeout_s
        self._next_id = 0
        self._unanswered: dict[int, _Unanswered] = {}  # by request id, oldest first
        self._outbox: collections.deque[int] = collections.deque()
        self._wake: asyncio.Event | None = None
        self._runner: asyncio.Task[None] | None = None
        self.streams_opened = 0

    async def send(self, request: bytes) -> Response:
        loop = asyncio.get_running_loop()
        if self._runner is None or self._runner.done() or self._runner.get_loop() is not loop:
            self._start(loop)
        assert self._wake is not None
        self._next_id += 1
        request_id = self._next_id
        future: asyncio.Future[Response] = loop.create_future()
        self._unanswered[request_id] = _Unanswered(frame(request_id, request), future)
        self._outbox.append(request_id)
        self._wake.set()
        try:
            return await await_within(future, self._timeout_s, "the ledger did not answer within {:g}s")
        finally:
            self._unanswered.pop(request_id, None)  # answered, failed, cancelled or timed out: never written again

    async def close(self) -> None:
        if self._runner is not None and not self._runner.done():
            self._runner.cancel()
            await asyncio.wait([self._runner])  # its outcome does not matter: the waiters are cancelled below
        for item in self._unanswered.values():
            item.future.cancel()
        self._runner = None

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._runner is not None and self._runner.get_loop() is not loop:  # the client moved to another loop
            self._unanswered.clear()
        self._outbox.clear()
        self._wake = asyncio.Event()
        self._runner = loop.create_task(self._run())
        self._runner.add_done_callback(self._stopped)

    def _stopped(self, runner: asyncio.Task[None]) -> None:
        """The runner only ends when cancelled (closing) or by a bug: then nobody may be left waiting."""
        if runner.cancelled() or runner.exception() is None:
            return
        error = runner.exception()
        log.error("the ledger append stream stopped unexpectedly: %r", error)
        for item in self._unanswered.values():
            if not item.future.done():
                item.future.set_exception(_error(grpc.StatusCode.INTERNAL, f"the append stream failed: {error!r}"))
        self._unanswered.clear()

    async def _run(self) -> None:
        """Keeps one stream open while there is work, re-opening it after a break."""
        assert self._wake is not None
        failures = 0
        while True:
            if not self._unanswered:
                self._wake.clear()
                await self._wake.wait()
                continue
            self.streams_opened += 1
            answered, error = await self._serve(self._open_stream())
            failures = 0 if answered else failures + 1
            if not self._unanswered:
                continue
            # A stream that ended otherwise (a wrong key, say) fails what is pending.
            reopen = isinstance(errors.typed(error), errors.APPEND_STREAM_REOPEN)
            if not reopen or failures >= max(self._retry.attempts, 1):
                log.debug("ledger append stream failed (%s); failing %d requests", error.code().name,
                          len(self._unanswered))  # fmt: skip
                for item in list(self._unanswered.values()):
                    if not item.future.done():
                        item.future.set_exception(_error(error.code(), error.details() or ""))
                self._unanswered.clear()
                failures = 0
                continue
            delay = self._retry.reconnect_delay(failures) if failures else 0.0
            log.debug("ledger append stream ended (%s); re-opening in %.3fs", error.code().name, delay)
            await asyncio.sleep(delay)

    async def _serve(self, call: grpc.aio.StreamStreamCall) -> tuple[bool, grpc.aio.AioRpcError]:
        """Writes every unanswered request (old ones first, after a break), then new ones as they come, until the
        stream ends. Returns whether any answer came back and the status the stream ended with."""
        assert self._wake is not None
        wake = self._wake
        outbox = self._outbox
        outbox.clear()
        outbox.extend(self._unanswered)
        answered = False
        ended: list[grpc.aio.AioRpcError] = []

        async def read() -> None:
            nonlocal answered
            try:
                while (response := await call.read()) is not grpc.aio.EOF:
                    answered = True
                    item = self._unanswered.pop(response.request_id, None)
                    if item is None or item.future.done():
                        continue
                    if response.error_code:
                        code = _CODES.get(response.error_code, grpc.StatusCode.UNKNOWN)
                        item.future.set_exception(_error(code, response.error_message))
                    else:
                        item.future.set_result(response.append)
                ended.append(_error(grpc.StatusCode.UNAVAILABLE, "the ledger closed the append stream"))
            except grpc.aio.AioRpcError as err:
                ended.append(err)
            finally:
                wake.set()

        reader = asyncio.create_task(read())
        try:
            # The ledger sends its headers as it accepts the stream; writing only after them means a stream it
            # refuses at once (a wrong key) ends with the ledger's own status. A write racing that end fails in
            # grpc's core, and grpc then overwrites the call's status with INTERNAL ("Internal error from Core"),
            # which reads as a broken transport: the stream was opened again (25 of 400 wrong-key appends on a
            # loaded machine did). Once per stream, so the append path pays it once.
            await call.initial_metadata()
            while not ended:
                while outbox and not ended:
                    item = self._unanswered.get(outbox.popleft())
                    if item is not None:
                        await call.write(item.frame)
                if not ended:
                    wake.clear()
                    await wake.wait()
        except grpc.aio.AioRpcError as err:
            ended.append(err)
        except asyncio.InvalidStateError:
            # Written after the call ended: the reader is about to get its status (say UNAUTHENTICATED). Let it,
            # before the cancel below, or it would read CANCELLED and the stream would be opened again for nothing.
            await asyncio.wait([reader])
        finally:
            call.cancel()
            if not reader.done():
                await asyncio.wait([reader])
        return answered, ended[0] if ended else _error(grpc.StatusCode.UNAVAILABLE, "the append stream broke")
