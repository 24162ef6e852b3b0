"""How the proxy and the console serve HTTP with uvicorn: client limits (a request head and body must arrive in
time, a connection cap), and httptools with each event-loop step's writes sent as one.

Limits: without them a client that opens a connection and sends half a request head (or nothing) holds a file
handle, and a place in the server, for good; enough of them leave nothing for real clients.

- header deadline: a request's head (request line and headers) must be complete this long after the connection
  opened or its first byte arrived; otherwise the server answers 408 and closes the connection.
- body deadline: its body must be complete this long after the head; otherwise 408 (or a close) too.
- connection cap: above it, a new connection first displaces the connection that has waited longest without a
  request in progress (idle keep-alive or an unfinished head); when none can go, the new one gets 503 with
  `Retry-After` and is closed at once, so the server never runs out of file handles.
- trusted connections: one on which the app has accepted a caller's key (`trust_connection(scope)`: an agent's
  token, the master key, a console session) is displaced only when no other connection is left to displace, so a
  flood of connections that never authenticate pushes out each other, not the agents' idle keep-alive ones; while
  such connections are present but too young to displace, a new connection gets the 503.

Coalescing: uvicorn writes a response's status line and headers, then its body, as two transport writes, and the
event loop sends each at once: two send() calls and two wake-ups of the client per answer. On loopback in a VM
every send costs the sender CPU; measured on the 64-client proxy benchmark (same-session A/B), one send per answer
instead of two takes about 8% off the proxy's CPU per call. Writes are buffered until the end of the current loop
step (one call_soon) and then sent together, in order.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger(__name__)

# File handles kept for everything but client and upstream connections (the ledger channel, logs, the loop).
_RESERVED_FILES = 64
# The ASGI scope extension (scope["extensions"]) through which the app marks a connection trusted.
TRUST_EXTENSION = "agl.trust_connection"


def trust_connection(scope: Any) -> None:
    """The app accepted this request's key: its connection is kept over ones that never authenticated (a no-op
    under another server)."""
    mark = scope.get("extensions", {}).get(TRUST_EXTENSION)
    if mark is not None:
        mark()


@dataclass(frozen=True)
class ClientLimits:
    max_connections: int = 4096
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    keep_alive_s: float = 75.0
    # A connection waiting this long without a request may be displaced by a new one when the cap is reached (a
    # real client's head arrives well within it; a slow one's never does).
    displace_after_s: float = 0.05
    # Who serves, and the variables that set the limits, as the 408 and 503 answers name them.
    server: str = "proxy"
    header_variable: str = "AGL_PROXY_HEADER_TIMEOUT"
    body_variable: str = "AGL_PROXY_BODY_TIMEOUT"
    cap_variable: str = "AGL_PROXY_MAX_CLIENT_CONNECTIONS"


def connection_budget(wanted: int, upstream: bool = True) -> int:
    """The connection cap the open-file limit allows, after raising the soft limit toward `wanted` if it can.
    With `upstream`, half of what the limit leaves is kept for connections the server opens itself."""
    share = 2 if upstream else 1
    need = share * wanted + _RESERVED_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        if target > soft:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
                soft = target
            except (ValueError, OSError) as err:
                log.warning("could not raise the open-file limit from %d to %d: %s", soft, target, err)
    if soft == resource.RLIM_INFINITY:
        return wanted
    allowed = max(16, (soft - _RESERVED_FILES) // share)
    if allowed < wanted:
        log.warning(
            "serving at most %d client connections (asked for %d): the open-file limit is %d", allowed, wanted, soft
        )
    return min(wanted, allowed)


class CoalescingTransport(asyncio.Transport):
    """Wraps a transport so that writes made in one event-loop step go out in one write, in order."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(bytes(data))

    def flush(self) -> None:
        if not self._pending:
            return
        data = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
        self._pending = []
        if not self._transport.is_closing():
            self._transport.write(data)

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def close(self) -> None:
        self.flush()  # what was written before close still goes, as with any transport
        self._transport.close()

    def abort(self) -> None:
        self._pending = []
        self._transport.abort()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(map(len, self._pending))

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._transport.get_write_buffer_limits()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.flush()
        self._transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._transport.get_protocol()


def _plain_answer(status: int, reason: str, error: tuple[str, str], message: str, extra: bytes = b"") -> bytes:
    """A whole HTTP/1.1 answer with an OpenAI-shaped error body (type, code) that closes the connection."""
    body = json.dumps({"error": {"message": message, "type": error[0], "code": error[1]}}).encode()
    head = f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
    return head.encode() + extra + b"connection: close\r\n\r\n" + body


class ConnectionGuard:
    """The client limits of one server (see the module's docstring): deadlines swept by one timer, and admission."""

    def __init__(self, limits: ClientLimits, loop: asyncio.AbstractEventLoop, connections: set[Any]) -> None:
        self.limits = limits
        self.loop = loop
        self.connections = connections
        self.refused = 0
        self.expired = 0
        self.displaced = 0
        shortest = min(limits.header_timeout_s, limits.body_timeout_s)
        self._interval = min(1.0, max(0.05, shortest / 4))
        self._timer = loop.call_later(self._interval, self._sweep)
        self.timeout_answer = _plain_answer(
            408,
            "Request Timeout",
            ("invalid_request_error", "request_timeout"),
            f"The request did not arrive in time: its head must arrive within {limits.header_timeout_s:g}s "
            f"({limits.header_variable}) and its body within {limits.body_timeout_s:g}s ({limits.body_variable}).",
        )
        self.refusal = _plain_answer(
            503,
            "Service Unavailable",
            ("service_unavailable_error", "too_many_connections"),
            f"The {limits.server} serves at most {limits.max_connections} connections ({limits.cap_variable}) and "
            "all are in use; retry later.",
            b"retry-after: 1\r\n",
        )

    def _sweep(self) -> None:
        now = self.loop.time()
        try:
            for connection in [c for c in self.connections if 0 < c.agl_deadline <= now]:
                self.expired += 1
                connection.agl_expire()
        finally:
            self._timer = self.loop.call_later(self._interval, self._sweep)

    def admit(self, new: GuardedHttpToolsProtocol) -> bool:
        """Whether `new` may be served: under the cap, or after displacing a connection waiting for a request."""
        if len(self.connections) <= self.limits.max_connections:
            return True
        live = 0
        untrusted = False  # a connection that never authenticated is open (waiting or not)
        oldest: dict[bool, GuardedHttpToolsProtocol] = {}  # trusted or not -> the one waiting longest
        for connection in self.connections:
            if connection is new or connection.transport is None or connection.transport.is_closing():
                continue
            live += 1
            trusted = connection.agl_trusted
            untrusted = untrusted or not trusted
            since = connection.agl_waiting_since
            if since is not None and (trusted not in oldest or since < oldest[trusted].agl_waiting_since):  # type: ignore[operator]
                oldest[trusted] = connection
        if live < self.limits.max_connections:
            return True
        # Untrusted first; a trusted one only when every open connection is trusted.
        candidate = oldest.get(False) or (None if untrusted else oldest.get(True))
        if candidate is not None and self.loop.time() - candidate.agl_waiting_since >= self.limits.displace_after_s:  # type: ignore[operator]
            self.displaced += 1
            candidate.agl_expire()
            return True
        self.refused += 1
        return False

    def close(self) -> None:
        self._timer.cancel()


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol over a CoalescingTransport, with the header and body deadlines and the
    connection cap of `limits` (pass it as uvicorn's `http`; `configure` sets the limits once per process).

    Per request this costs four attribute updates in parser callbacks uvicorn calls anyway; the deadlines are
    checked by one timer per process, not one per connection.
    """

    limits = ClientLimits()

    # Deadline of the current phase on the loop's clock (0: none), and since when the connection has been waiting
    # for a request (None while one is being read or answered).
    agl_deadline: float = 0.0
    agl_waiting_since: float | None = None
    # The app accepted a key on this connection (trust_connection): displaced last.
    agl_trusted: bool = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(CoalescingTransport(transport, self.loop))
        now = self.loop.time()
        self.agl_waiting_since = now
        self.agl_deadline = now + self.limits.header_timeout_s
        guard: ConnectionGuard | None = getattr(self.server_state, "agl_guard", None)
        if guard is None:
            guard = ConnectionGuard(self.limits, self.loop, self.connections)
            self.server_state.agl_guard = guard  # type: ignore[attr-defined]
        if not guard.admit(self):
            self.agl_deadline = 0.0
            self.agl_waiting_since = None
            self.transport.write(guard.refusal)
            self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope["extensions"] = {TRUST_EXTENSION: self._agl_trust}  # type: ignore[typeddict-unknown-key]
        if self.agl_waiting_since is not None and self.agl_deadline == 0.0:  # idle keep-alive -> a new head
            now = self.loop.time()
            self.agl_waiting_since = now
            self.agl_deadline = now + self.limits.header_timeout_s

    def on_headers_complete(self) -> None:
        if self.agl_waiting_since is not None:
            self.agl_waiting_since = None
            self.agl_deadline = self.loop.time() + self.limits.body_timeout_s
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self.agl_deadline = 0.0  # the request is in; answering it has the engine's own timeouts
        super().on_message_complete()

    def on_response_complete(self) -> None:
        pipelined = bool(self.pipeline)
        super().on_response_complete()
        if not pipelined:
            self.agl_waiting_since = self.loop.time()  # idle: uvicorn's keep-alive timer closes it in time

    def _agl_trust(self) -> None:
        self.agl_trusted = True

    def agl_expire(self) -> None:
        """A deadline passed (or the connection is displaced): 408 unless an answer has begun, then close."""
        waiting = self.agl_waiting_since is not None and self.agl_deadline > 0.0
        self.agl_deadline = 0.0
        self.agl_waiting_since = None
        if self.transport.is_closing():
            return
        started = self.cycle is not None and self.cycle.response_started
        if waiting or (self.cycle is not None and not started):
            self.transport.write(self.server_state.agl_guard.timeout_answer)  # type: ignore[attr-defined]
        self.transport.close()


def configure(limits: ClientLimits) -> None:
    """Sets the limits every GuardedHttpToolsProtocol of this process serves with (called once at startup)."""
    GuardedHttpToolsProtocol.limits = limits
