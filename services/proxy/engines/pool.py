"""A keep-alive HTTP/1.1 connection pool used as the transport of the proxy's shared httpx.AsyncClient.

Why not httpcore's pool: in httpcore 1.0.x every request added to or removed from the pool re-scans all
connections, and for each idle one re-counts all of them (quadratic), with a poll() syscall per connection to
detect server-side closes. With 64 busy connections that measured ~5,000 is_idle() calls and ~11 ms of CPU per
proxied call. Here a request takes the most recently used idle connection of its origin in O(1) (a closed one is
seen by its reader's EOF flag, no syscall), and gives it back when its body has been read to the end. A body
with a Content-Length (every non-streamed answer) is read together with the head, so the connection is back in
the pool before the caller sees the answer, and the caller reads it as already-loaded content; chunked and
close-delimited bodies (SSE streams) are read as the caller iterates them.

Scope: what the engines speak (HTTP/1.1 or 1.0, plain or TLS, Content-Length, chunked or close-delimited
bodies). Errors surface as httpx exceptions, so callers handle them as with any httpx transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import sys
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

import httpx

T = TypeVar("T")
_READ_SIZE = 64 * 1024
_NO_BODY_STATUSES = frozenset({204, 304})
_TIMEOUTS = (TimeoutError, asyncio.TimeoutError)  # distinct types before Python 3.11


async def _within(awaitable: Awaitable[T], seconds: float | None) -> T:
    if seconds is None:
        return await awaitable
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(seconds):
            return await awaitable
    return await asyncio.wait_for(awaitable, seconds)  # pragma: no cover - Python 3.10


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.idle_since = 0.0
        self.reused = False
        self.head_read = False  # in the current exchange
        self.timed_out = False

    def expire(self) -> None:
        """The read timeout of an exchange: aborting the connection ends the pending read."""
        self.timed_out = True
        self.writer.transport.abort()

    def usable(self, now: float, expiry_s: float) -> bool:
        return not self.reader.at_eof() and not self.writer.is_closing() and now - self.idle_since < expiry_s

    def close(self) -> None:
        self.writer.close()


def _parse_head(head: bytes) -> tuple[int, bytes, list[tuple[bytes, bytes]], bytes]:
    lines = head.split(b"\r\n")
    version, _, rest = lines[0].partition(b" ")
    code, _, reason = rest.partition(b" ")
    if not version.startswith(b"HTTP/") or not code.isdigit():
        raise httpx.RemoteProtocolError(f"malformed status line {lines[0][:100]!r}")
    headers = []
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(b":")
            headers.append((name.strip(), value.strip()))
    return int(code), reason, headers, version


def _loaded_response(
    status: int, headers: list[tuple[bytes, bytes]], body: bytes, extensions: dict[str, Any]
) -> httpx.Response:
    """A response whose body is already in memory. httpx's own way (content=...) runs the body through its
    decoder and chunker generators once more, 20 us per answer here against 4; an answer without a
    Content-Encoding needs no decoding, so its content is set as httpx's read() would have set it. An encoded
    answer goes the public way and is decoded by httpx."""
    if any(name.lower() == b"content-encoding" for name, _ in headers):
        return httpx.Response(status, headers=headers, content=body, extensions=extensions)
    response = httpx.Response(status, headers=headers, stream=httpx.ByteStream(body), extensions=extensions)
    response._content = body  # what read() stores; aread(), .content, .json() and aiter_bytes() all use it
    return response


class _ReadDeadline:
    """The read timeout of a streamed body: a read pending longer than `seconds` aborts the connection (which ends
    the read; the reader then sees `conn.timed_out`). One timer serves every read of the body: `begin`/`end` only
    note the time, and the timer, when it fires, re-arms itself for the pending read's own deadline. An
    asyncio.timeout around each read (two per SSE chunk) cost a fifth of the proxy's CPU on streamed calls. Time
    the caller spends between reads, such as waiting on a slow agent, does not count, as with httpx's own pool.
    With `seconds` None there is no timer and reads wait as long as they take."""

    def __init__(self, conn: _Connection, seconds: float | None) -> None:
        self._conn = conn
        self._seconds = seconds
        self._loop = asyncio.get_running_loop()
        self._started: float | None = None  # when the pending read began; None while no read is pending
        self._timer = self._loop.call_later(seconds, self._check) if seconds is not None else None

    def begin(self) -> None:
        self._started = self._loop.time()

    def end(self) -> None:
        self._started = None

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def _check(self) -> None:
        assert self._seconds is not None
        now = self._loop.time()
        if self._started is None:
            self._timer = self._loop.call_later(self._seconds, self._check)
        elif now - self._started >= self._seconds:
            self._conn.expire()
        else:
            self._timer = self._loop.call_later(self._started + self._seconds - now, self._check)


class _Body(httpx.AsyncByteStream):
    """A chunked or close-delimited response body, read as the caller iterates it; the connection goes back to the
    pool once the body has been read to its end."""

    def __init__(
        self,
        pool: EnginePool,
        key: tuple[str, str, int],
        conn: _Connection,
        chunked: bool,
        keep_alive: bool,
        read_timeout: float | None,
    ) -> None:
        self._pool, self._key, self._conn = pool, key, conn
        self._chunked, self._keep_alive = chunked, keep_alive
        self._timeout = read_timeout
        self._complete = False
        self._closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        conn = self._conn
        reader = conn.reader
        deadline = _ReadDeadline(conn, self._timeout)
        try:
            if self._chunked:
                while True:
                    deadline.begin()
                    line = await reader.readline()
                    size = int(line.split(b";", 1)[0].strip() or b"x", 16)
                    if size == 0:
                        while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                            pass
                        break
                    data = await reader.readexactly(size + 2)
                    deadline.end()
                    yield data[:-2]
            else:
                self._keep_alive = False
                deadline.begin()
                while data := await reader.read(_READ_SIZE):
                    deadline.end()
                    yield data
                    deadline.begin()
            if conn.timed_out:  # the end of the body was the connection being aborted
                raise httpx.ReadTimeout("timed out reading the engine's response")
            self._complete = True
        except (ValueError, asyncio.IncompleteReadError, ConnectionError, OSError) as err:
            if conn.timed_out:  # whatever the aborted read ended with
                raise httpx.ReadTimeout("timed out reading the engine's response") from None
            if isinstance(err, ValueError):  # a bad chunk-size line
                raise httpx.RemoteProtocolError(f"malformed chunked body: {err}") from None
            raise httpx.ReadError(f"reading the engine's response failed: {err!r}") from None
        finally:
            deadline.cancel()
            if self._complete:
                await self.aclose()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._pool._release(self._key, self._conn, reusable=self._complete and self._keep_alive)


class EnginePool(httpx.AsyncBaseTransport):
    def __init__(self, *, max_connections: int = 1024, keepalive_expiry_s: float = 60.0) -> None:
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._slots = asyncio.Semaphore(max_connections)
        self._expiry = keepalive_expiry_s
        self._ssl: ssl.SSLContext | None = None
        self.opened = 0  # connections opened so far (a benchmark figure)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if url.scheme not in ("http", "https"):
            raise httpx.UnsupportedProtocol(f"unsupported scheme {url.scheme!r}")
        key = (url.scheme, url.host, url.port or (443 if url.scheme == "https" else 80))
        timeouts: dict[str, float | None] = request.extensions.get("timeout", {})
        stream = request.stream
        if isinstance(stream, httpx.SyncByteStream):  # bytes content (httpx.ByteStream): no awaiting needed
            body = b"".join(stream)
        else:
            body = b"".join([part async for part in stream])  # type: ignore[union-attr]
        lines = [b"%s %s HTTP/1.1" % (request.method.encode(), url.raw_path)]
        lines += [b"%s: %s" % (name, value) for name, value in request.headers.raw]
        # Streamed content comes with Transfer-Encoding: chunked; it was read whole, so it goes with a length
        # instead (content-length: 0 when the stream was empty: a chunked header without chunks would hang).
        if "content-length" not in request.headers and (body or "transfer-encoding" in request.headers):
            lines = [line for line in lines if not line.lower().startswith(b"transfer-encoding:")]
            lines.append(b"content-length: %d" % len(body))
        payload = b"\r\n".join(lines) + b"\r\n\r\n" + body
        if self._slots.locked():  # all slots busy: wait for one, within the pool timeout
            try:
                await _within(self._slots.acquire(), timeouts.get("pool"))
            except _TIMEOUTS:
                raise httpx.PoolTimeout("no free connection slot") from None
        else:
            await self._slots.acquire()  # returns at once (no timer to arm)
        try:
            return await self._exchange(request, key, payload, timeouts)
        except BaseException:
            self._slots.release()
            raise

    async def _exchange(
        self, request: httpx.Request, key: tuple[str, str, int], payload: bytes, timeouts: dict[str, Any]
    ) -> httpx.Response:
        read_timeout = timeouts.get("read")
        loop = asyncio.get_running_loop()
        while True:
            conn = self._take(key) or await self._connect(key, timeouts.get("connect"))
            conn.head_read = False
            # The read timeout is a timer that aborts the connection (a timed-out connection is closed anyway): it
            # costs a third of an asyncio.timeout. It covers the head and a Content-Length body together, which
            # the engine writes at once when the answer is complete.
            timer = loop.call_later(read_timeout, conn.expire) if read_timeout is not None else None
            try:
                conn.writer.write(payload)
                return await self._answer(request, key, conn, read_timeout)
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, OSError) as err:
                conn.close()
                if conn.timed_out:
                    raise httpx.ReadTimeout("timed out waiting for the engine's answer") from None
                nothing_read = not conn.head_read and (
                    not isinstance(err, asyncio.IncompleteReadError) or not err.partial
                )
                if conn.reused and nothing_read:
                    continue  # the engine had closed this idle connection: the request never reached it
                raise httpx.ReadError(f"the engine connection failed: {err!r}") from None
            except BaseException:
                conn.close()
                raise
            finally:
                if timer is not None:
                    timer.cancel()

    async def _answer(
        self, request: httpx.Request, key: tuple[str, str, int], conn: _Connection, read_timeout: float | None
    ) -> httpx.Response:
        """Reads the answer's head; a Content-Length body is read here too and the connection given back at once,
        any other body (chunked, such as an SSE stream, or ended by close) is read as the caller iterates it."""
        reader = conn.reader
        head = await reader.readuntil(b"\r\n\r\n")
        while head[9:10] == b"1" and not head.startswith(b"HTTP/1.1 101"):  # skip 1xx interim answers
            head = await reader.readuntil(b"\r\n\r\n")
        conn.head_read = True
        status, reason, headers, version = _parse_head(head[:-4])
        length: int | None = None
        chunked = False
        keep_alive = version == b"HTTP/1.1"
        for name, value in headers:
            lowered = name.lower()
            if lowered == b"content-length":
                if not value.isdigit():
                    raise httpx.RemoteProtocolError(f"malformed content-length {value[:40]!r}")
                length = int(value)
            elif lowered == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif lowered == b"connection":
                keep_alive = b"close" not in value.lower() and (keep_alive or b"keep-alive" in value.lower())
        if request.method == "HEAD" or status in _NO_BODY_STATUSES:
            length, chunked = 0, False
        extensions = {"http_version": version, "reason_phrase": reason}
        if chunked or length is None:
            stream = _Body(self, key, conn, chunked, keep_alive, read_timeout)
            return httpx.Response(status, headers=headers, stream=stream, extensions=extensions)
        body = await reader.readexactly(length) if length else b""
        response = _loaded_response(status, headers, body, extensions)
        self._release(key, conn, reusable=keep_alive)
        return response

    def _take(self, key: tuple[str, str, int]) -> _Connection | None:
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if conn.usable(now, self._expiry):
                conn.reused = True
                return conn
            conn.close()
        return None

    async def _connect(self, key: tuple[str, str, int], timeout: float | None) -> _Connection:
        scheme, host, port = key
        context = None
        if scheme == "https":
            context = self._ssl = self._ssl or ssl.create_default_context()
        try:
            reader, writer = await _within(
                asyncio.open_connection(host, port, ssl=context, limit=_READ_SIZE * 16), timeout
            )
        except _TIMEOUTS:
            raise httpx.ConnectTimeout(f"connecting to {host}:{port} timed out") from None
        except OSError as err:
            raise httpx.ConnectError(f"cannot connect to {host}:{port}: {err}") from None
        self.opened += 1
        return _Connection(reader, writer)

    def _release(self, key: tuple[str, str, int], conn: _Connection, reusable: bool) -> None:
        self._slots.release()
        if reusable and not conn.reader.at_eof():
            conn.idle_since = time.monotonic()
            self._idle.setdefault(key, []).append(conn)
        else:
            conn.close()

    async def aclose(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
                with contextlib.suppress(OSError, ConnectionError):
                    await conn.writer.wait_closed()
        self._idle.clear()
