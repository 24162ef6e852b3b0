"""The proxy's keep-alive transport (EnginePool) and shared client (Upstream) against a scripted HTTP/1.1 server."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import gzip
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from services.client import RetryPolicy
from services.proxy.engines.pool import EnginePool
from services.proxy.engines.routing import Endpoint
from services.proxy.engines.upstream import Upstream


@dataclass
class Seen:
    """One request as the server received it."""

    method: str
    path: str
    headers: dict[str, str]  # names lower-cased
    body: bytes
    connection: int  # which accepted connection carried it, from 1
    names: list[str]  # every header line's name, lower-cased, in order (repeats show here, not in `headers`)


Reply = Callable[[Seen, asyncio.StreamWriter], Awaitable[None]]


def answer(status: int, body: bytes = b"", *headers: str) -> bytes:
    head = [f"HTTP/1.1 {status} X", f"content-length: {len(body)}", *headers]
    return "\r\n".join(head).encode() + b"\r\n\r\n" + body


async def echo_path(seen: Seen, out: asyncio.StreamWriter) -> None:
    out.write(answer(200, seen.path.encode()))


class Engine:
    """A loopback server that parses each request and lets `reply` write the raw answer (or close, or stall)."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.connections = 0
        self.seen: list[Seen] = []
        self._handlers: list[tuple[asyncio.Task[None], asyncio.StreamWriter]] = []

    async def __aenter__(self) -> Engine:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        for _, out in self._handlers:
            out.close()  # ends both the handlers waiting for a request and the replies stalled until close
        await asyncio.gather(*(handler for handler, _ in self._handlers))
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, out: asyncio.StreamWriter) -> None:
        self._handlers.append((asyncio.current_task(), out))  # type: ignore[arg-type]
        self.connections += 1
        number = self.connections
        try:
            while not out.is_closing():
                head = (await reader.readuntil(b"\r\n\r\n")).decode().split("\r\n")
                method, path, _ = head[0].split(" ")
                pairs = [line.split(":", 1) for line in head[1:] if line]
                headers = {name.strip().lower(): value.strip() for name, value in pairs}
                body = await reader.readexactly(int(headers.get("content-length", 0)))
                seen = Seen(method, path, headers, body, number, [name.strip().lower() for name, _ in pairs])
                self.seen.append(seen)
                await self.reply(seen, out)
                if not out.is_closing():
                    await out.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client closed the connection
        finally:
            out.close()


@contextlib.asynccontextmanager
async def pooled(**pool_args: Any) -> AsyncIterator[tuple[httpx.AsyncClient, EnginePool]]:
    pool = EnginePool(**pool_args)
    timeout = httpx.Timeout(1.0, read=0.3)
    async with httpx.AsyncClient(transport=pool, timeout=timeout, trust_env=False) as client:
        yield client, pool


async def test_sequential_requests_share_one_connection() -> None:
    async with Engine(echo_path) as engine, pooled() as (client, pool):
        for i in range(5):
            response = await client.post(f"{engine.url}/n/{i}", content=b"x" * i)
            assert (response.status_code, response.content) == (200, f"/n/{i}".encode())
        assert (engine.connections, pool.opened) == (1, 1)
        assert [seen.body for seen in engine.seen] == [b"x" * i for i in range(5)]


async def test_concurrent_requests_open_one_connection_each_then_reuse_them() -> None:
    async def slow(seen: Seen, out: asyncio.StreamWriter) -> None:
        await asyncio.sleep(0.05)  # every request is in flight before the first answer
        await echo_path(seen, out)

    async with Engine(slow) as engine, pooled() as (client, pool):
        for _ in range(2):
            responses = await asyncio.gather(*(client.get(f"{engine.url}/{i}") for i in range(20)))
            assert [r.content for r in responses] == [f"/{i}".encode() for i in range(20)]
            assert (engine.connections, pool.opened) == (20, 20)


async def test_max_connections_caps_the_connections_opened() -> None:
    async with Engine(echo_path) as engine, pooled(max_connections=3) as (client, pool):
        responses = await asyncio.gather(*(client.get(f"{engine.url}/{i}") for i in range(20)))
        assert all(r.status_code == 200 for r in responses)
        assert engine.connections == pool.opened <= 3


async def test_chunked_body_is_reassembled_and_trailers_consumed() -> None:
    async def chunked(seen: Seen, out: asyncio.StreamWriter) -> None:
        out.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        out.write(b"3\r\nhel\r\n3;ext=1\r\nlo \r\nA\r\nworld,0123\r\n0\r\nx-trailer: 1\r\n\r\n")

    async with Engine(chunked) as engine, pooled() as (client, pool):
        for _ in range(2):
            assert (await client.get(engine.url)).content == b"hello world,0123"
        assert pool.opened == 1


async def test_streamed_chunks_arrive_as_they_are_sent() -> None:
    first_seen = asyncio.Event()

    async def two_chunks(seen: Seen, out: asyncio.StreamWriter) -> None:
        out.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await out.drain()
        await first_seen.wait()  # the second chunk is sent only once the client has the first
        out.write(b"6\r\nsecond\r\n0\r\n\r\n")

    async with Engine(two_chunks) as engine, pooled() as (client, _):
        response = await client.send(client.build_request("GET", engine.url), stream=True)
        pieces = []
        async for piece in response.aiter_bytes():
            pieces.append(piece)
            first_seen.set()
        await response.aclose()
        assert pieces == [b"first", b"second"]


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.0 200 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n",
        b"HTTP/1.0 200 OK\r\ncontent-length: 2000\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2000\r\n\r\n",
    ],
)
async def test_answers_that_end_the_connection_are_read_whole_and_not_reused(head: bytes) -> None:
    async def answer_and_end(seen: Seen, out: asyncio.StreamWriter) -> None:
        out.write(head + seen.path.encode() * 1000)
        if b"content-length" not in head:
            out.close()  # ends the body; with a length, a lax server keeps the connection, the client must not

    async with Engine(answer_and_end) as engine, pooled() as (client, pool):
        for path in ("/a", "/b"):
            assert (await client.get(engine.url + path)).content == path.encode() * 1000
        assert (engine.connections, pool.opened) == (2, 2)


async def test_idle_connection_closed_by_server_is_replaced() -> None:
    async def answer_then_close(seen: Seen, out: asyncio.StreamWriter) -> None:
        out.write(answer(200, b"ok"))  # says nothing of closing: the client learns it from EOF
        await out.drain()
        out.close()

    async with Engine(answer_then_close) as engine, pooled() as (client, pool):
        for _ in range(2):
            assert (await client.get(engine.url)).content == b"ok"
            await asyncio.sleep(0.05)
        assert (engine.connections, pool.opened) == (2, 2)


async def test_reused_connection_dropped_before_answering_is_retried_on_a_new_one() -> None:
    async def drop_second_on_first_connection(seen: Seen, out: asyncio.StreamWriter) -> None:
        if seen.connection == 1 and len(engine.seen) == 2:
            out.close()  # the race where the engine closes an idle connection as the request goes out
        else:
            await echo_path(seen, out)

    async with Engine(drop_second_on_first_connection) as engine, pooled() as (client, pool):
        assert (await client.get(f"{engine.url}/1")).content == b"/1"
        assert (await client.get(f"{engine.url}/2")).content == b"/2"
        assert [(s.path, s.connection) for s in engine.seen] == [("/1", 1), ("/2", 1), ("/2", 2)]
        assert pool.opened == 2


@pytest.mark.parametrize(("reused", "partial"), [(False, b""), (True, b"HTTP/1.1 200")])
async def test_connection_failure_is_not_retried_when_unsafe(reused: bool, partial: bytes) -> None:
    """A fresh connection, or one that had started answering, fails the request instead of repeating it."""

    async def fail_on_path_fail(seen: Seen, out: asyncio.StreamWriter) -> None:
        if seen.path == "/fail":
            out.write(partial)
            await out.drain()
            out.close()
        else:
            await echo_path(seen, out)

    async with Engine(fail_on_path_fail) as engine, pooled() as (client, _):
        if reused:
            await client.get(f"{engine.url}/warm")
        with pytest.raises(httpx.ReadError):
            await client.get(f"{engine.url}/fail")
        assert [s.path for s in engine.seen].count("/fail") == 1


@pytest.mark.parametrize("stall", [b"", b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhi\r\n"])
async def test_read_timeout_releases_the_slot(stall: bytes) -> None:
    async def stall_on_hang(seen: Seen, out: asyncio.StreamWriter) -> None:
        if seen.path != "/hang":
            return await echo_path(seen, out)
        out.write(stall)
        await out.wait_closed()  # until the test ends

    async with Engine(stall_on_hang) as engine, pooled(max_connections=1) as (client, pool):
        started = time.monotonic()
        with pytest.raises(httpx.ReadTimeout):
            await client.get(f"{engine.url}/hang")
        assert 0.25 < time.monotonic() - started < 1.0
        # With one slot, a leaked one would make this a PoolTimeout; the stalled connection is not reused.
        assert (await client.get(f"{engine.url}/ok")).content == b"/ok"
        assert pool.opened == 2


async def test_a_stalled_close_delimited_body_is_a_timeout_not_its_end() -> None:
    """The timeout aborts the connection, which ends the read like the server closing would: still a timeout."""

    async def stall(seen: Seen, out: asyncio.StreamWriter) -> None:
        out.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\ndata: 1\n\n")
        await out.wait_closed()  # until the test ends

    async with Engine(stall) as engine, pooled() as (client, _):
        response = await client.send(client.build_request("GET", engine.url), stream=True)
        received = []
        started = time.monotonic()
        with pytest.raises(httpx.ReadTimeout):
            async for part in response.aiter_raw():
                received.append(part)
        assert received == [b"data: 1\n\n"]
        assert 0.25 < time.monotonic() - started < 1.0


@pytest.mark.parametrize("chunked", [True, False])
async def test_the_read_timeout_bounds_each_wait_not_the_whole_body_or_the_readers_pauses(chunked: bool) -> None:
    """Chunks 0.15 s apart for 0.9 s in all, under a 0.3 s read timeout, read by a caller that also pauses 0.5 s
    between two chunks: nothing times out."""

    async def trickle(seen: Seen, out: asyncio.StreamWriter) -> None:
        head = "transfer-encoding: chunked" if chunked else "connection: close"
        out.write(f"HTTP/1.1 200 OK\r\n{head}\r\n\r\n".encode())
        for n in range(6):
            await asyncio.sleep(0.15)
            out.write(b"1\r\n%d\r\n" % n if chunked else b"%d" % n)
            await out.drain()
        out.write(b"0\r\n\r\n" if chunked else b"")
        if not chunked:
            out.close()

    async with Engine(trickle) as engine, pooled() as (client, _):
        response = await client.send(client.build_request("GET", engine.url), stream=True)
        received, paused = b"", False
        async for part in response.aiter_raw():
            received += part
            if len(received) >= 2 and not paused:
                paused = True
                await asyncio.sleep(0.5)  # the caller busy elsewhere: not the engine's delay
        assert received == b"012345" and paused


@pytest.mark.parametrize(("method", "head"), [("GET", "204 No Content"), ("GET", "304 X"), ("HEAD", "200 OK")])
async def test_bodiless_answers_keep_the_connection(method: str, head: str) -> None:
    async def no_body(seen: Seen, out: asyncio.StreamWriter) -> None:
        # A HEAD answer announces the length its GET would have, and sends nothing.
        out.write(f"HTTP/1.1 {head}\r\ncontent-length: 5\r\n\r\n".encode())

    async with Engine(no_body) as engine, pooled() as (client, pool):
        for _ in range(3):
            response = await client.request(method, engine.url)
            assert (response.status_code, response.content) == (int(head[:3]), b"")
        assert pool.opened == 1


@pytest.mark.parametrize("parts", [[b'{"a":', b"1}"], []])
async def test_streamed_request_content_is_sent_with_a_content_length(parts: list[bytes]) -> None:
    async def content() -> AsyncIterator[bytes]:
        for part in parts:
            yield part

    async with Engine(echo_path) as engine, pooled() as (client, _):
        assert (await client.post(engine.url + "/s", content=content())).status_code == 200
        [seen] = engine.seen
        # The body goes out whole, so a chunked header would leave a real server waiting for chunks.
        assert "transfer-encoding" not in seen.headers
        assert (seen.body, seen.headers.get("content-length", "0")) == (b"".join(parts), str(len(b"".join(parts))))


@contextlib.asynccontextmanager
async def upstream(**args: str) -> AsyncIterator[Upstream]:
    up = Upstream(RetryPolicy(attempts=1), max_connections=4, connect_timeout_s=1.0, read_timeout_s=1.0, **args)
    try:
        yield up
    finally:
        await up.close()


async def test_upstream_keeps_no_cookies() -> None:
    async def set_cookie(seen: Seen, out: asyncio.StreamWriter) -> None:
        out.write(answer(200, b"{}", "set-cookie: session=abc; Path=/"))

    async with Engine(set_cookie) as engine, upstream() as up:
        endpoints = [Endpoint(engine.url + "/v1")]
        for rollout in ("r1", "r2"):
            result = await up.call(endpoints, "/chat/completions", b"{}", stream=False, rollout_id=rollout)
            assert result.response is not None and result.response.headers["set-cookie"].startswith("session=")
        assert [seen.headers.get("cookie") for seen in engine.seen] == [None, None]
        assert not up.client.cookies
        assert up.pool.opened == 1


async def test_upstream_request_framing() -> None:
    async with Engine(echo_path) as engine, upstream(api_key="k3y") as up:
        body = b'{"model": "m", "messages": []}'
        result = await up.call([Endpoint(engine.url + "/v1/")], "/chat/completions", body, stream=False, rollout_id="r")
        assert result.response is not None and result.response.content == b"/v1/chat/completions"
        [seen] = engine.seen
        assert (seen.method, seen.path, seen.body) == ("POST", "/v1/chat/completions", body)
        assert seen.headers["content-length"] == str(len(body))
        assert seen.headers["host"] == engine.url.removeprefix("http://")
        assert seen.headers["content-type"] == "application/json"
        assert seen.headers["accept-encoding"] == "identity"
        assert seen.headers["authorization"] == "Bearer k3y"
        assert sorted(seen.names) == sorted(set(seen.names))  # no header sent twice


async def test_loaded_answers_read_like_httpx_answers() -> None:
    """A Content-Length answer comes back loaded; every way of reading it gives the body, and one that is
    content-encoded anyway (the proxy asks for identity) is still decoded."""
    payload = b'{"answer": "h\xc3\xa9llo"}'

    async def reply(seen: Seen, out: asyncio.StreamWriter) -> None:
        if seen.path == "/gzip":
            out.write(answer(200, gzip.compress(payload), "content-encoding: gzip", "content-type: application/json"))
        else:
            out.write(answer(200, payload, "content-type: application/json; charset=utf-8"))

    async with Engine(reply) as engine, pooled() as (client, pool):
        for path in ("/plain", "/gzip"):
            response = await client.post(engine.url + path, content=b"{}")
            assert response.content == payload, path
            assert response.json() == {"answer": "h\u00e9llo"}
            assert response.text == payload.decode()
            assert b"".join([part async for part in response.aiter_bytes()]) == payload
            assert await response.aread() == payload
            streamed = client.build_request("POST", engine.url + path, content=b"{}")
            opened = await client.send(streamed, stream=True)
            assert b"".join([part async for part in opened.aiter_bytes()]) == payload
            await opened.aclose()
        assert pool.opened == 1


async def test_answered_calls_leave_no_cycles_for_the_garbage_collector() -> None:
    """httpx's response and its body stream point at each other; the upstream breaks that cycle once the answer is
    read, so a finished call's objects go at once instead of piling up for the collector."""
    async with Engine(echo_path) as engine, upstream() as up:
        endpoints = [Endpoint(engine.url + "/v1")]
        await up.call(endpoints, "/warm", b"{}", stream=False, rollout_id="r")
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            for n in range(20):
                result = await up.call(endpoints, f"/n/{n}", b"{}", stream=False, rollout_id="r")
                assert result.response is not None and result.response.content == f"/v1/n/{n}".encode()
            del result
            gc.collect()
            left = [o for o in gc.garbage if isinstance(o, httpx.Response | httpx.Request)]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
        assert left == []


@pytest.mark.parametrize("bad", ["http://a:1/v1\n", "http://a:1/v1\r\nX-Injected: 1", "http://[::1/v1"])
async def test_an_unroutable_endpoint_url_fails_over_to_the_next_endpoint(bad: str) -> None:
    """Issue 30 finding 11: an endpoint whose URL cannot be used (stored before the ledger checked URLs) is one
    failed try, like an unreachable engine: the call goes to the next endpoint instead of being a 500."""

    async def ok(seen: Seen, out: asyncio.StreamWriter) -> None:
        out.write(answer(200, b"{}"))

    async with Engine(ok) as engine:
        up = Upstream(RetryPolicy(attempts=2), max_connections=4, connect_timeout_s=1.0, read_timeout_s=1.0)
        try:
            endpoints = [Endpoint(bad), Endpoint(engine.url + "/v1")]
            result = await up.call(endpoints, "/chat/completions", b"{}", stream=False, rollout_id="r")
            assert result.response is not None and result.response.status_code == 200
            assert result.endpoint.url == engine.url + "/v1" and result.retries == 1
            alone = await up.call(endpoints[:1], "/chat/completions", b"{}", stream=False, rollout_id="r")
            assert alone.error is not None and alone.error.kind == "upstream_unreachable", alone
            assert "not a usable URL" in alone.error.message and "\n" not in alone.error.message, alone.error.message
        finally:
            await up.close()
