"""Issue 30 finding 18 against a real proxy: an agent that leaves mid-request, or whose body deadline passes, is one
log line naming the rollout and what happened, never a traceback (those stay for real bugs)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest

from tests.support.procs import ServiceProcess

from .conftest import KEY, MODEL, Http, base_url, event_url, new_rollout, run_proxy, set_engine

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "What is 2 + 2?"}]}


@pytest.fixture(scope="module")
def quick_proxy(ledger: ServiceProcess, engine: Http) -> Iterator[Http]:
    with run_proxy(ledger.address, args=["--body-timeout", "1"]) as process:
        yield process


def _head(path: str, length: int) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


async def _connect(proxy: Http) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = proxy.url.removeprefix("http://").rsplit(":", 1)
    return await asyncio.open_connection(host, int(port))


async def test_agents_leaving_or_timing_out_are_one_line_each_with_the_rollout(quick_proxy, engine, client) -> None:
    left, timed_out, waited = [await new_rollout(client) for _ in range(3)]
    start = len(quick_proxy.process.log_text())
    # 1. The agent leaves half-way through its call's body.
    _, writer = await _connect(quick_proxy)
    path = base_url(quick_proxy, left).removeprefix(quick_proxy.url) + "/chat/completions"
    writer.write(_head(path, 1000) + b'{"model": ')
    await writer.drain()
    writer.close()
    # 2. An event's body never completes: 408 at the deadline.
    reader, writer = await _connect(quick_proxy)
    writer.write(_head(event_url(quick_proxy, timed_out).removeprefix(quick_proxy.url), 1000) + b"{")
    answer = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 408"), answer
    # 3. The agent gives up while the engine is still answering.
    set_engine(engine, delay_ms=1500)
    try:
        reader, writer = await _connect(quick_proxy)
        body = json.dumps(CHAT).encode()
        path = base_url(quick_proxy, waited).removeprefix(quick_proxy.url) + "/chat/completions"
        writer.write(_head(path, len(body)) + body)
        await writer.drain()
        await asyncio.sleep(0.3)
        writer.close()
        await asyncio.sleep(2.0)
    finally:
        set_engine(engine, delay_ms=0)
    # 4. The agent leaves in the middle of a streamed answer.
    streamed = await new_rollout(client)
    reader, writer = await _connect(quick_proxy)
    body = json.dumps({**CHAT, "stream": True, "max_tokens": 8, "standin": {"chunk_delay_ms": 300}}).encode()
    path = base_url(quick_proxy, streamed).removeprefix(quick_proxy.url) + "/chat/completions"
    writer.write(_head(path, len(body)) + body)
    assert (await asyncio.wait_for(reader.readuntil(b"data: "), 10)).startswith(b"HTTP/1.1 200")
    writer.close()
    await asyncio.sleep(3.0)
    log = quick_proxy.process.log_text()[start:]
    assert "Traceback" not in log and "Exception in ASGI" not in log, log
    lines = log.splitlines()
    assert any(left in line and "left" in line for line in lines), log
    assert any(timed_out in line and "left" in line for line in lines), log
    assert await client.list_events(left) == [] and await client.list_events(timed_out) == []
