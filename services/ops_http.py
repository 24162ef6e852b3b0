"""The operational HTTP port of the gRPC services (the ledger's /metrics; the controller's /metrics, /healthz and
/readyz): a fixed, small number of threads whatever the number of connections, and no connection kept for long.

One thread runs an event loop of its own (a busy service loop never fails a probe); handlers run on a pool of
HANDLER_THREADS threads (a slow scrape of a large registry does not hold up /healthz). Limits, so that silent or
slow clients cannot pile up:

- a request's head (request line and headers, at most MAX_HEAD_BYTES) must arrive within HEAD_TIMEOUT_S of the
  connection opening, else 408 and the connection is closed;
- the answer must be taken within WRITE_TIMEOUT_S, else the connection is dropped;
- at most MAX_CONNECTIONS are open: a new one above the cap displaces the one that has waited longest for its head
  (if it waited DISPLACE_AFTER_S, which a real client's head never needs), else it gets 503 and is closed.

Every answer closes its connection (`Connection: close`): probes and scrapers open one per request anyway.
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import socket
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http import HTTPStatus
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

log = logging.getLogger(__name__)

HEAD_TIMEOUT_S = 5.0
WRITE_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 64
DISPLACE_AFTER_S = 0.05
MAX_HEAD_BYTES = 16 << 10
HANDLER_THREADS = 2

TEXT = "text/plain; charset=utf-8"


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    headers: Mapping[str, str]  # names in lower case


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    content_type: str = TEXT
    headers: tuple[tuple[str, str], ...] = field(default=())


Handler = Callable[[Request], Answer]


def metrics_answer(registry: CollectorRegistry, request: Request) -> Answer:
    """The registry in the format the scraper asks for (Prometheus text or OpenMetrics), gzipped if it accepts it."""
    encoder, content_type = choose_encoder(request.headers.get("accept", ""))
    body = encoder(registry)
    if "gzip" in request.headers.get("accept-encoding", ""):
        return Answer(200, gzip.compress(body, compresslevel=1), content_type, (("Content-Encoding", "gzip"),))
    return Answer(200, body, content_type)


def metrics_only(registry: CollectorRegistry, service: str) -> Handler:
    """A handler serving the registry at /metrics and 404 elsewhere."""
    not_found = f"not found: the {service} serves /metrics on this port\n".encode()

    def handle(request: Request) -> Answer:
        return metrics_answer(registry, request) if request.path == "/metrics" else Answer(404, not_found)

    return handle


def _head_answer(status: int, message: str) -> bytes:
    body = f"{message}\n".encode()
    reason = HTTPStatus(status).phrase
    head = f"HTTP/1.1 {status} {reason}\r\nContent-Type: {TEXT}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n"
    return head.encode() + b"\r\n" + body


def _parse_head(head: bytes) -> Request | None:
    try:
        lines = head.decode("latin-1").split("\r\n")
        method, target, version = lines[0].split(" ")
    except ValueError:
        return None
    if not version.startswith("HTTP/1."):
        return None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if line and not sep:
            return None
        if line:
            headers[name.strip().lower()] = value.strip()
    return Request(method, urlsplit(target).path, headers)


class _Connection:
    def __init__(self, writer: asyncio.StreamWriter, opened: float) -> None:
        self.writer = writer
        self.opened = opened
        self.reading_head = True


class OpsServer:
    """`handler` served on host:port (see the module's docstring). The port is bound by the constructor, so a port
    in use fails the caller at once; `start` serves it in a thread of its own, `shutdown` stops and joins it."""

    def __init__(self, host: str, port: int, handler: Handler, *, name: str) -> None:
        host = host.strip("[]")  # "[::]" as in a gRPC address
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._socket = socket.create_server((host, port), family=family, backlog=128)
        self.server_port: int = self._socket.getsockname()[1]
        self._handler = handler
        self._name = name
        self._pool = ThreadPoolExecutor(HANDLER_THREADS, thread_name_prefix=f"{name}-handler")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._connections: set[_Connection] = set()
        self._stopped = asyncio.Event()  # set through the loop by shutdown()

    def start(self) -> OpsServer:
        self._thread.start()
        return self

    def shutdown(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stopped.set)
            self._thread.join(timeout=5.0)
        else:
            self._socket.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve())
        finally:
            self._loop.close()

    async def _serve(self) -> None:
        server = await asyncio.start_server(self._on_connection, sock=self._socket, limit=MAX_HEAD_BYTES)
        async with server:
            await self._stopped.wait()
            server.close()
            for connection in list(self._connections):
                connection.writer.transport.abort()

    def _admit(self, new: _Connection) -> bool:
        if len(self._connections) < MAX_CONNECTIONS:
            return True
        waiting = [c for c in self._connections if c.reading_head]
        oldest = min(waiting, key=lambda c: c.opened, default=None)
        if oldest is None or new.opened - oldest.opened < DISPLACE_AFTER_S:
            return False
        oldest.writer.transport.abort()
        self._connections.discard(oldest)
        return True

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = _Connection(writer, asyncio.get_running_loop().time())
        if not self._admit(connection):
            message = f"the {self._name} port serves at most {MAX_CONNECTIONS} connections and all are in use"
            writer.write(_head_answer(503, message))
            writer.transport.close()
            return
        self._connections.add(connection)
        try:
            answer = await self._answer(reader, connection)
            if answer is not None:
                writer.write(answer)
                await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT_S)
        except (TimeoutError, ConnectionError):
            pass
        finally:
            self._connections.discard(connection)
            if writer.transport.get_write_buffer_size():  # not taken in time: drop it
                writer.transport.abort()
            else:
                writer.close()

    async def _answer(self, reader: asyncio.StreamReader, connection: _Connection) -> bytes | None:
        """The bytes to send back, or None when the client went away or was displaced."""
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_S)
        except TimeoutError:
            return _head_answer(408, f"the request head did not arrive within {HEAD_TIMEOUT_S:g} s")
        except asyncio.LimitOverrunError:
            return _head_answer(431, f"the request head is over {MAX_HEAD_BYTES} bytes")
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        connection.reading_head = False
        request = _parse_head(head[:-4])
        if request is None:
            return _head_answer(400, "not an HTTP/1.x request")
        if request.method not in ("GET", "HEAD"):
            return _head_answer(405, f"{request.method} is not served here: GET only")
        try:
            answer = await asyncio.get_running_loop().run_in_executor(self._pool, self._handler, request)
        except Exception:
            log.exception("%s: answering %s failed", self._name, request.path)
            return _head_answer(500, "internal error (see the service's log)")
        head_lines = [
            f"HTTP/1.1 {answer.status} {HTTPStatus(answer.status).phrase}",
            f"Content-Type: {answer.content_type}",
            f"Content-Length: {len(answer.body)}",
            "Connection: close",
            *(f"{name}: {value}" for name, value in answer.headers),
        ]
        body = b"" if request.method == "HEAD" else answer.body
        return ("\r\n".join(head_lines) + "\r\n\r\n").encode("latin-1") + body
